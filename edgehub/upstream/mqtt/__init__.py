"""The MQTT upstream: ``$upstream`` as an ``Endpoint`` over MQTT 3.1.1 or 5 to a broker or a parent hub, on the
codec's client side (``edgehub.mqtt.client``), on the event loop. The format and behaviour it offers the world is
docs/upstream.md.

* ``settings``: the settings (each documented, keyword-only) and the status values.
* ``wire``: a batch or a message as PUBLISHes, and their bytes on the wire.
* ``connection``: one connection to the broker and the PUBLISHes it has in flight (an asyncio ``Protocol``).
* ``transport``: ``MqttUpstream``, the endpoint: the window, the uplink budget, acks into results, reconnects.
* ``inbound``: what the broker publishes, dispatched to the hub (its twin, the cloud's side); ``cloud``: the
  cloud's side (device-bound messages, method calls).

Each name is imported from its home module; this package re-exports nothing (importing ``settings`` must not load
the transport).
"""
