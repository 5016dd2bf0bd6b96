"""AMQP 1.0 head: python-qpid-proton's engine under our own asyncio socket loop (not proton's reactor), split as
the MQTT head is.

Sans-IO, no sockets, no clocks:

* ``sasl``: the SASL exchange (ours: proton's cannot check a SAS token); ``connection``: one connection
  (``AmqpConnection``: SASL, then proton's ``Transport``/``Connection``/``Collector``), bytes in, ``events`` out.
* ``iothub``: Azure IoT Hub's AMQP conventions (link addresses, usernames, ``$cbs``, the message mapping).
* ``refusals``: every refusal of a message as the condition of its ``rejected`` outcome, in one table.

The asyncio adapter:

* ``client_socket``: one connection's socket side (reads, TLS start, pausing, the idle timer, flushing).
* ``session``: one connection's session side (login, links, ingest groups and settlement, deliveries).
* ``server``: the listeners (``AmqpServer``); ``settings``: ``AmqpSettings``, every limit with its safe default.

The three build on what both heads share (``protocol_heads.socket_side``, ``listeners``, ``limits``).
"""

from protocol_heads.amqp.server import AmqpServer, AmqpSettings

__all__ = ["AmqpServer", "AmqpSettings"]
