"""MQTT head: a sans-IO codec and connection state machine under a thin asyncio adapter (split as h11 splits).

Sans-IO, no sockets, no clocks:

* ``packets``: the packet values (frozen msgspec Structs), their codes and the codec's errors.
* ``decoder`` / ``encoder``: bytes in → packets out, packets in → bytes out (each name is imported from its
  home module; there is no re-exporting module).
* ``fastpaths``: the per-message shortcuts (a PUBLISH on a known topic, PUBACK-only reads, a delivery's and an
  ack's bytes), each pinned to its general path by tests/protocol_heads/mqtt/test_fastpaths.py.
* ``states``: the connection's transition table; ``events``: what a connection tells the server; ``acks``: the
  inbound ack slots in arrival order; ``connection``: the server side of one connection (``ServerConnection``).
* ``iothub``: Azure IoT Hub topic, property-bag, identity and ACL conventions (pure functions).
* ``refusals``: every refusal of a message as the reason code of its negative PUBACK, in one table.
* ``caches``: per-connection memo dictionaries bounded in bytes (the topic caches).

The asyncio adapter:

* ``client_socket``: one connection's socket side (reads, quick-ack, pausing, keepalive, TLS start, flushing).
* ``session``: one connection's session side (login, events, ingest groups, twins, subscriptions, will).
* ``server``: the listeners (``MqttServer``); ``settings``: ``MqttSettings``, every limit with its safe default.

The three build on what both heads share (``protocol_heads.socket_side``, ``listeners``, ``limits``).
"""

from protocol_heads.mqtt.server import MqttServer, MqttSettings

__all__ = ["MqttServer", "MqttSettings"]
