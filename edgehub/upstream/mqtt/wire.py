"""The MQTT upstream's wire units: a batch (or one message) as the PUBLISHes that carry it, and their byte count.

A ``Unit`` is one PUBLISH and the messages it carries; the transport's window, uplink budget and status count
``Unit.wire_bytes``. The wire modes (segments in batch mode, the IoT Hub telemetry topic in message mode) are
described in ``edgehub.upstream.mqtt.transport``.

Invariants: ``wire_bytes`` is the PUBLISH's size on the wire, fixed header to payload (``publish_wire_bytes``),
MQTT 5 properties included; in batch mode every message of the batch is in exactly one unit, in order, and a
segment's payload is larger than ``segment_bytes`` only when it holds a single message; a zstd segment is
compressed with the dictionary it is given and names it (frame header; MQTT 5: ``v=2;dict=id``). A dictionary
travels in a unit of its own (``dictionary_unit``) that carries no message.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgehub.core import SystemProperty
from edgehub.core.property_bag import KEY_OF
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.mqtt.client import PublishProperties
from edgehub.mqtt.varint import varint_len
from edgehub.upstream.batching import batch_text, edge_message_id
from edgehub.upstream.mqtt.settings import MqttProtocol, MqttUpstreamSettings, WireMode
from edgehub.upstream.segment import Codec, compress_segment

__all__ = [
    "DICTIONARY_CONTENT_TYPE",
    "SEGMENT_CONTENT_TYPE",
    "Unit",
    "dictionary_unit",
    "publish_properties",
    "publish_units",
    "publish_wire_bytes",
]

SEGMENT_CONTENT_TYPE = "application/x-edgehub-segment;v=1;encoding={codec}"
# A segment compressed with a dictionary is container version 2: a reader needs the dictionary it names.
DICT_SEGMENT_CONTENT_TYPE = "application/x-edgehub-segment;v=2;encoding=zstd;dict={dict_id}"
DICTIONARY_CONTENT_TYPE = "application/x-edgehub-zstd-dictionary;dict={dict_id}"


def publish_properties(user: list[tuple[str, str]], content_type: str | None = None) -> tuple[PublishProperties, int]:
    """MQTT 5 PUBLISH properties and their encoded length (without the length prefix)."""
    props = PublishProperties(tuple(user), content_type)
    return props, len(props.packed)


def publish_wire_bytes(topic: str, payload_len: int, *, qos: int = 1, properties_len: int | None = None) -> int:
    """Bytes of a PUBLISH on the wire: fixed header, topic, packet id, MQTT 5 properties, payload."""
    rem = 2 + len(topic.encode()) + (2 if qos else 0) + payload_len
    if properties_len is not None:
        rem += varint_len(properties_len) + properties_len
    return 1 + varint_len(rem) + rem


@dataclass(slots=True)
class Unit:
    """One PUBLISH and the messages it carries."""

    topic: str
    payload: bytes
    messages: Sequence[QueuedMessage]
    properties: PublishProperties | None
    wire_bytes: int
    raw_bytes: int = 0  # the segment's uncompressed bytes (batch mode)


def dictionary_unit(s: MqttUpstreamSettings, data: bytes, dict_id: int) -> Unit:
    """The PUBLISH that carries a zstd dictionary to the far side, before any segment that uses it."""
    topic = s.dictionary_topic.format(hub_id=s.hub_id, lane=s.lane, dict_id=dict_id)
    props: PublishProperties | None = None
    props_len: int | None = None
    if s.protocol is MqttProtocol.V5:
        props, props_len = publish_properties(
            [("edgehub-dictionary-id", str(dict_id))], DICTIONARY_CONTENT_TYPE.format(dict_id=dict_id)
        )
    return Unit(topic, data, (), props, publish_wire_bytes(topic, len(data), properties_len=props_len))


def publish_units(
    s: MqttUpstreamSettings,
    batch: Sequence[QueuedMessage],
    *,
    dictionary: tuple[int, bytes] | None = None,
    observe: Callable[[bytes], None] | None = None,
    max_wire_bytes: int | None = None,
) -> list[Unit]:
    """``batch`` as the PUBLISHes that carry it in ``s.wire_mode``; zstd segments with ``dictionary`` (its id and
    bytes) when given; ``observe`` sees each segment's uncompressed text (the dictionary's sample). Segments are
    cut so that each PUBLISH is at most ``max_wire_bytes`` (the broker's Maximum Packet Size) unless it holds one
    message; a message alone over it stays over it (the connection refuses to send it)."""
    if s.wire_mode is WireMode.MESSAGE:
        return [_message_unit(s, qm) for qm in batch]
    return _segment_units(s, batch, dictionary, observe, max_wire_bytes)


def _edge_id(s: MqttUpstreamSettings, qm: QueuedMessage) -> str:
    return edge_message_id(qm, hub_id=s.hub_id, lane=s.lane)


def _segment_units(
    s: MqttUpstreamSettings,
    batch: Sequence[QueuedMessage],
    dictionary: tuple[int, bytes] | None,
    observe: Callable[[bytes], None] | None,
    max_wire_bytes: int | None,
) -> list[Unit]:
    topic = s.batch_topic.format(hub_id=s.hub_id, lane=s.lane, priority=batch[0].priority)
    if s.compression is Codec.ZSTD:
        topic += "/zstd"
    else:
        dictionary = None
    props: PublishProperties | None = None
    props_len: int | None = None
    if s.protocol is MqttProtocol.V5:
        if dictionary is not None:
            user = [("edgehub-segment-version", "2"), ("edgehub-segment-codec", "zstd")]
            user.append(("edgehub-segment-dictionary", str(dictionary[0])))
            props, props_len = publish_properties(user, DICT_SEGMENT_CONTENT_TYPE.format(dict_id=dictionary[0]))
        else:
            props, props_len = publish_properties(
                [("edgehub-segment-version", "1"), ("edgehub-segment-codec", str(s.compression))],
                SEGMENT_CONTENT_TYPE.format(codec=s.compression),
            )
    zdict = dictionary[1] if dictionary is not None else None
    # Cut into runs whose compressed size is about max_batch_bytes (and whose PUBLISH is within max_wire_bytes):
    # halve a run until it fits (or is one message), so compression still sees as many messages as fit.
    units: list[Unit] = []
    stack: list[Sequence[QueuedMessage]] = [batch]
    while stack:
        run = stack.pop()
        text = batch_text(run, hub_id=s.hub_id, lane=s.lane)
        payload = compress_segment(text, compresslevel=s.level, codec=s.compression, dictionary=zdict)
        wire = publish_wire_bytes(topic, len(payload), properties_len=props_len)
        too_big = len(payload) > s.segment_bytes or (max_wire_bytes is not None and wire > max_wire_bytes)
        if too_big and len(run) > 1:
            mid = len(run) // 2
            stack.append(run[mid:])
            stack.append(run[:mid])
            continue
        if observe is not None:
            observe(text)
        units.append(Unit(topic, payload, run, props, wire, len(text)))
    return units


def _message_unit(s: MqttUpstreamSettings, qm: QueuedMessage) -> Unit:
    m = qm.message
    device = s.device_id or s.client_id.split("/")[0]
    base = f"devices/{device}/modules/{s.module_id}" if s.module_id else f"devices/{device}"
    bag: list[tuple[str, str]] = []
    for k, v in m.properties.items():
        bag.append((k, v if v is not None else ""))
    for name, short in KEY_OF.items():
        value = m.system_properties.get(name)
        if value is not None:
            bag.append((short, value))
    if SystemProperty.MESSAGE_ID not in m.system_properties:
        bag.append(("$.mid", _edge_id(s, qm)))
    topic = f"{base}/messages/events/{urllib.parse.urlencode(bag, quote_via=urllib.parse.quote)}"
    props_len: int | None = None
    props: PublishProperties | None = None
    if s.protocol is MqttProtocol.V5:
        props, props_len = publish_properties(bag)
        topic = f"{base}/messages/events/"
    return Unit(topic, m.body, (qm,), props, publish_wire_bytes(topic, len(m.body), properties_len=props_len))
