"""The composition root: what a hub is started with (``config``), where each running setting came from
(``settings``), the store and identities (``store``), the upstream transports (``upstream``), and ``serve``, which
builds the hub from them step by step and runs it until stopped. Importing the package imports none of them."""
