"""The one MQTT 3.1.1 and 5.0 codec, sans I/O, for both roles: the MQTT head (a server reading clients) and the
MQTT upstream (a client reading a broker) share its packets, property table, decoder and encoder, as h11 is one
codec for HTTP clients and servers.

* ``packets``: the packet values (frozen msgspec Structs), their codes, the property table and the codec's errors.
* ``decoder`` / ``encoder``: bytes in → packets out, packets in → bytes out.
* ``fastpaths``: the per-message shortcuts (a PUBLISH on a known topic, PUBACK-only reads, a delivery's and an
  ack's bytes), each pinned to its general path by tests/mqtt/test_fastpaths.py.
* ``caches``: per-connection memo dictionaries bounded in bytes (the decoder's and encoder's topic caches).
* ``varint``: the variable byte integer's encoder and its length.
* ``client``: the client's side as the upstream speaks it: the packets it writes, and what a server sends it
  checked and summarised.

Invariants: no sockets, no clocks, no tasks (the layer contract forbids asyncio here); imports only
``edgehub.core`` and msgspec. Each name is imported from its home module; this package re-exports nothing.
"""
