"""What MQTT can never carry to a module input or a device's cloud-to-device queue, asked at ingest
(``edgehub.hub.Carriage``).

A module gets a message on ``devices/{d}/modules/{m}/inputs/{i}/{bag}`` and a device on
``devices/{d}/messages/devicebound/{bag}`` (``protocol_heads.mqtt.iothub``), the bag holding the message's
properties. A topic is an MQTT string: over 65,535 bytes of UTF-8 (or not UTF-8 at all) the encoder refuses it
(``edgehub.mqtt.encoder.string_field`` raises ``UnencodableField``), the link turns that into a PERMANENT
delivery failure, and the hub dead-letters the message. ``MqttCarriage`` asks the same function of the same
topic before the message is stored, so that the hub can refuse it to its sender instead.

Invariants: it never says no to a message some client could be sent: the topic is built with the shortest
device id there is (one character) and with the properties the message has at ingest (a delivery adds none that
go in the bag), so the topic a real delivery builds is never shorter; what it does not know (``$upstream``, a
client's Maximum Packet Size, which only the client sets) it answers None for. A bound on the bag's length
(``_MAX_QUOTED_PER_CHAR`` bytes a character) skips building the topic for every message that cannot come near the
limit, which is nearly all of them.
"""

from __future__ import annotations

from edgehub.core import DeviceId, Identity, Message, ModuleId
from edgehub.core.endpoints import parse_device_endpoint, parse_module_endpoint
from edgehub.mqtt.encoder import UnencodableField, string_field
from protocol_heads.mqtt.iothub import device_bound_topic, module_input_topic

__all__ = ["MqttCarriage"]

_MAX_TOPIC_BYTES = 65_535
# A character of a property percent-encoded in the bag: up to 4 UTF-8 bytes, each "%XX".
_MAX_QUOTED_PER_CHAR = 12
_BAG_OVERHEAD = 8  # per property: its "=" and "&", and a "$." key as long as the longest system name
_SHORTEST_DEVICE = DeviceId("d")  # the topic a real delivery builds has a device id at least this long


class MqttCarriage:
    """``edgehub.hub.Carriage`` for a hub whose clients can only be MQTT clients (no AMQP head): a module input's
    or a device's message whose topic MQTT cannot carry."""

    def cannot_carry(self, endpoint: str, message: Message) -> str | None:
        if not _could_be_too_long(endpoint, message):
            return None
        module = parse_module_endpoint(endpoint)
        if module is not None:
            name, input_name = module
            topic = module_input_topic(Identity(_SHORTEST_DEVICE, ModuleId(name)), input_name, message)
        else:
            device = parse_device_endpoint(endpoint)
            if device is None:
                return None
            topic = device_bound_topic(Identity(DeviceId(device)), message)
        try:
            string_field(topic)
        except UnencodableField as exc:
            return f"its topic for {endpoint} cannot be sent over MQTT: {exc}"
        return None


def _could_be_too_long(endpoint: str, message: Message) -> bool:
    """False when the message's bag cannot make its topic for ``endpoint`` pass MQTT's limit, whatever its
    characters; True otherwise (the topic must then be built to know)."""
    chars = 0
    for name, value in message.system_properties.items():
        chars += len(name) + len(value) + _BAG_OVERHEAD
    for key, app_value in message.properties.items():
        chars += len(key) + (len(app_value) if app_value is not None else 0) + _BAG_OVERHEAD
    # The topic's fixed words ("devices/", "/modules/", "/inputs/", ...) are under 64 bytes; its names are the
    # endpoint's own, each at most 4 bytes a character.
    return chars * _MAX_QUOTED_PER_CHAR + 4 * len(endpoint) + 64 > _MAX_TOPIC_BYTES
