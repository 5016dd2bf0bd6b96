"""MQTT head: a sans-IO codec and connection state machine under a thin asyncio adapter (split as h11 splits).

The codec (packets, decoder, encoder, fast paths, topic caches) is ``edgehub.mqtt``, shared with the MQTT
upstream. Sans-IO, no sockets, no clocks:

* ``states``: the connection's transition table; ``events``: what a connection tells the server; ``acks``: the
  inbound ack slots in arrival order; ``connection``: the server side of one connection (``ServerConnection``).
* ``iothub``: Azure IoT Hub topic, property-bag, identity and ACL conventions (pure functions).
* ``refusals``: every refusal of a message as the reason code of its negative PUBACK, in one table.

The asyncio adapter:

* ``client_socket``: one connection's socket side (reads, quick-ack, pausing, keepalive, TLS start, flushing).
* ``session``: one connection's session side (login, events, ingest groups, twins, subscriptions, will).
* ``server``: the listeners (``MqttServer``); ``settings``: ``MqttSettings``, every limit with its safe default.

The three build on what both heads share (``protocol_heads.socket_side``, ``listeners``, ``limits``).
"""

from protocol_heads.mqtt.server import MqttServer, MqttSettings

__all__ = ["MqttServer", "MqttSettings"]
