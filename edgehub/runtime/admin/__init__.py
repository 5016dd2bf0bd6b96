"""The admin API: HTTP/1.1 on 127.0.0.1 behind a bearer token (``server``), its routes (``api``, ``status``,
``metrics``, ``identities``, ``deadletters``), its sans-I/O HTTP (``http``), the files it leaves in the data
directory (``files``) and the client the CLI uses (``client``). Importing the package imports none of them."""
