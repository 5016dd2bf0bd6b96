"""MQTT head: a sans-IO codec and connection state machine under a thin asyncio adapter.

* ``codec``: MQTT 3.1.1 and 5.0 packets, bytes in → packets out and back (no state, no I/O).
* ``connection``: the server side of one connection as one transition table (``ServerConnection``).
* ``iothub``: Azure IoT Hub topic, property-bag, identity and ACL conventions (pure functions).
* ``caches``: per-connection memo dictionaries bounded in bytes (the topic caches).
* ``settings``: ``MqttSettings``, every limit of the head with its safe default.
* ``server``: the asyncio adapter (``MqttServer``, ``MqttSettings``) that talks to ``edgehub.hub.Hub``.
"""

from protocol_heads.mqtt.server import MqttServer, MqttSettings

__all__ = ["MqttServer", "MqttSettings"]
