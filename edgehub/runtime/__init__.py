"""The runtime: what turns edgehub's layers into a running hub and lets an operator steer it.

* ``edgehub.runtime.compose.serve``: the composition root, ``serve``, which wires the store, the router, the hub
  facade, the upstream transports and the heads, and runs them until stopped.
* ``edgehub.runtime.cli``: the ``edgehub`` command line (``run`` and the operator's tools).
* ``edgehub.runtime.admin``: the admin API on 127.0.0.1 (``/status``, ``/metrics``, identities, dead letters) and
  its client.
* ``edgehub.runtime.deployment``: the deployment manifest checked in a child process, applied whole to the running
  hub, watched and reported.
* Modules at this level serve more than one of them: the hardware profiles, the data directory, TLS certificates,
  the identity seal key, logging, sd_notify, the memory collector, capacity figures.

Importing this package imports nothing: a serving hub loads only the modules it uses (tests/e2e/test_lazy_imports).
"""
