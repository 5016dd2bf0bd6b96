"""The codec's fast paths: the per-message packets (a PUBLISH on a known topic, a plain PUBACK, a QoS 1
delivery) read or written without the general machinery. No I/O, no state of their own.

Each is a shortcut for exactly what the general path does, and only that: ``publish_fast`` gives the ``Publish``
the general decoder gives, or None where it cannot be sure (a new topic, properties, anything odd), and then the
general decoder reads the packet; ``plain_puback_ids`` answers only for reads of nothing but ``40 02`` PUBACKs;
``encode_qos1_publish`` and ``puback_success`` give the bytes ``encode`` gives. The tests that pin each to its
general path are tests/mqtt/test_fastpaths.py; a change here needs them green.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Mapping
from typing import Final

from edgehub.mqtt.caches import BudgetDict, topic_cost
from edgehub.mqtt.encoder import fixed_header, packet_id_field, string_field
from edgehub.mqtt.packets import NO_PROPERTIES, Publish

__all__ = ["encode_qos1_publish", "plain_puback_ids", "puback_success", "publish_fast"]


def publish_fast(
    topics: Mapping[bytes, str], v5: bool, first: int, buf: bytes | bytearray, body: int, end: int
) -> Publish | None:
    """The PUBLISH in ``buf[body:end]`` (``first``: its first byte) if its topic is in ``topics`` (topics the
    general decoder has read and validated) and it has no MQTT 5 properties; None for anything else."""
    flags = first & 0x0F
    qos = (flags >> 1) & 0x03
    p = body + 2
    if qos == 3 or p > end:
        return None
    topic_end = p + ((buf[body] << 8) | buf[body + 1])
    if topic_end > end:
        return None
    raw = buf[p:topic_end]
    topic = topics.get(raw if type(raw) is bytes else bytes(raw))
    if topic is None:
        return None
    p = topic_end
    packet_id = None
    if qos:
        if p + 2 > end:
            return None
        packet_id = (buf[p] << 8) | buf[p + 1]
        if packet_id == 0:
            return None
        p += 2
    elif flags & 0x08:  # DUP on QoS 0
        return None
    if v5:
        if p >= end or buf[p] != 0:  # properties present
            return None
        p += 1
    payload = buf[p:end]
    return Publish(
        topic,
        payload if type(payload) is bytes else bytes(payload),
        qos,
        bool(flags & 0x01),
        bool(flags & 0x08),
        packet_id,
        NO_PROPERTIES,
    )


def plain_puback_ids(data: bytes) -> list[int] | None:
    """The packet ids of ``data`` if it is nothing but whole PUBACKs that carry only a packet id (``40 02`` and
    the id: MQTT 3.1.1, and MQTT 5's success); else None. Only for a decoder at a packet boundary
    (``Decoder.at_packet_boundary``): the bytes must start a packet."""
    n = len(data)
    if not n or n & 3:
        return None
    k = n >> 2
    if data[0::4] != b"\x40" * k or data[1::4] != b"\x02" * k:
        return None
    ids = [(data[i] << 8) | data[i + 1] for i in range(2, n, 4)]
    return None if 0 in ids else ids  # packet id 0 is a protocol violation: the general path says so


# puback_success(packet_id): ``encode(PubAck(packet_id), level)`` for either level (reason 0 without properties
# is the short form): PUBACK, remaining length 2, the id. A partial of struct's C packer: one per message.
puback_success: Final[Callable[[int], bytes]] = functools.partial(struct.Struct("!BBH").pack, 0x40, 2)


def encode_qos1_publish(
    topic: str,
    payload: bytes,
    packet_id: int,
    *,
    dup: bool = False,
    v5: bool = False,
    names: BudgetDict[str, bytes] | None = None,
) -> bytes:
    """``encode(Publish(topic, payload, 1, False, dup, packet_id), level)`` without building the packet: a QoS 1
    PUBLISH with no properties, how the hub delivers to modules. ``names``: the connection's cache of topics'
    wire bytes (topics recur: one per module input and bag)."""
    pid = packet_id_field(packet_id)
    name = names.get(topic) if names is not None else None
    if name is None:
        name = string_field(topic)
        if names is not None:
            names.remember(topic, name, topic_cost(len(name) - 2))
    length = len(name) + (3 if v5 else 2) + len(payload)
    return b"".join((fixed_header(0x3A if dup else 0x32, length), name, pid, b"\x00" if v5 else b"", payload))
