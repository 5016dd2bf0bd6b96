"""MQTT 3.1.1 and 5.0 encoding: packet values in, wire bytes out. No state, no I/O.

Invariant: ``encode`` raises only ``LocalProtocolError`` (a value that cannot be put on the wire), and never
returns bytes the decoder would refuse for the same protocol level. A field MQTT cannot carry at all (a string or
binary field over 65,535 bytes, text that is no UTF-8) raises ``UnencodableField``, an ``UnsendablePacket``: the
same packet can never be sent, so a caller that would retry it must not (a delivery whose topic is too long is
dead-lettered at once, not retried for its whole TTL).
"""

from __future__ import annotations

import struct
from typing import Final

from edgehub.core import LocalProtocolError
from edgehub.mqtt.packets import (
    MQTT_50,
    MQTT_311,
    PROPERTY_KIND,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from edgehub.mqtt.varint import encode_varint

__all__ = [
    "UnencodableField",
    "UnsendablePacket",
    "encode",
    "encode_varint",
    "fixed_header",
    "packet_id_field",
    "property_bytes",
    "string_field",
]

_MAX_U16: Final = 0xFFFF
_U16: Final = struct.Struct("!H")


class UnsendablePacket(LocalProtocolError):
    """A packet that can never be sent as it stands, whatever is retried: a field MQTT cannot carry
    (``UnencodableField``), or a packet over the client's Maximum Packet Size (``connection.PeerPacketTooLarge``)."""


class UnencodableField(UnsendablePacket):
    """A string or binary field over MQTT's 65,535 bytes, or text that is no UTF-8 (a lone surrogate)."""


def string_field(text: str) -> bytes:
    """A UTF-8 string field: its length as two bytes, then the text."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UnencodableField(f"a string field that is not UTF-8 text ({exc.reason} at {exc.start})") from None
    if len(raw) > _MAX_U16:
        raise UnencodableField(f"a string field of {len(raw):,} bytes, over MQTT's {_MAX_U16:,}")
    return _U16.pack(len(raw)) + raw


def _binary(data: bytes) -> bytes:
    if len(data) > _MAX_U16:
        raise UnencodableField(f"a binary field of {len(data):,} bytes, over MQTT's {_MAX_U16:,}")
    return struct.pack("!H", len(data)) + data


def property_bytes(props: Properties) -> bytes:
    """MQTT 5 properties without their length prefix (what a sender counts against a Maximum Packet Size)."""
    out = bytearray()
    for pid, value in props.values.items():
        kind = PROPERTY_KIND[pid]
        out += encode_varint(pid)
        if kind in "bhiv":
            if not isinstance(value, int):
                raise LocalProtocolError(f"property {pid.name} needs an int")
            try:
                if kind == "b":
                    out += struct.pack("!B", value)
                elif kind == "h":
                    out += struct.pack("!H", value)
                elif kind == "i":
                    out += struct.pack("!I", value)
                else:
                    out += encode_varint(value)
            except struct.error as exc:
                raise LocalProtocolError(f"property {pid.name} value {value} out of range") from exc
        elif kind == "s":
            if not isinstance(value, str):
                raise LocalProtocolError(f"property {pid.name} needs a str")
            out += string_field(value)
        else:
            if not isinstance(value, bytes):
                raise LocalProtocolError(f"property {pid.name} needs bytes")
            out += _binary(value)
    for name, value in props.user:
        out += b"\x26" + string_field(name) + string_field(value)
    return bytes(out)


def _properties(props: Properties) -> bytes:
    raw = property_bytes(props)
    return encode_varint(len(raw)) + raw


def _packet(first: int, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return fixed_header(first, len(body)) + body


def _ack_tail(reason_code: int, props: Properties, v5: bool, *, short_ok: bool = True) -> bytes:
    """MQTT 5 lets an ack drop the reason code when it is 0 and no properties follow."""
    if not v5:
        return b""
    if props:
        return bytes([reason_code]) + _properties(props)
    if reason_code == 0 and short_ok:
        return b""
    return bytes([reason_code])


def packet_id_field(packet_id: int) -> bytes:
    """A packet identifier: non-zero, two bytes [MQTT-2.2.1-3]."""
    if not 1 <= packet_id <= _MAX_U16:
        raise LocalProtocolError(f"packet identifier {packet_id} out of range")
    return _U16.pack(packet_id)


def encode(packet: Packet, protocol_level: int = MQTT_311) -> bytes:
    """Wire bytes of ``packet`` for ``protocol_level`` (4: 3.1.1, 5: 5.0). CONNECT uses its own level."""
    v5 = protocol_level == MQTT_50
    if type(packet) is Publish:
        return _encode_publish(packet, v5)
    if isinstance(packet, PubAck | PubRec | PubRel | PubComp):
        first = {PubAck: 0x40, PubRec: 0x50, PubRel: 0x62, PubComp: 0x70}[type(packet)]
        return _packet(first, packet_id_field(packet.packet_id), _ack_tail(packet.reason_code, packet.properties, v5))
    if isinstance(packet, Connect):
        return _encode_connect(packet)
    if isinstance(packet, ConnAck):
        tail = _properties(packet.properties) if v5 else b""
        return _packet(0x20, bytes([int(packet.session_present), packet.reason_code]), tail)
    if isinstance(packet, Subscribe):
        parts = [packet_id_field(packet.packet_id)]
        if v5:
            parts.append(_properties(packet.properties))
        for s in packet.subscriptions:
            opts = s.qos
            if v5:
                opts |= (s.no_local << 2) | (s.retain_as_published << 3) | (s.retain_handling << 4)
            parts.append(string_field(s.topic_filter) + bytes([opts]))
        return _packet(0x82, *parts)
    if isinstance(packet, SubAck):
        props = _properties(packet.properties) if v5 else b""
        return _packet(0x90, packet_id_field(packet.packet_id), props, bytes(packet.reason_codes))
    if isinstance(packet, Unsubscribe):
        props = _properties(packet.properties) if v5 else b""
        return _packet(0xA2, packet_id_field(packet.packet_id), props, *(string_field(t) for t in packet.topic_filters))
    if isinstance(packet, UnsubAck):
        if v5:
            return _packet(
                0xB0, packet_id_field(packet.packet_id), _properties(packet.properties), bytes(packet.reason_codes)
            )
        return _packet(0xB0, packet_id_field(packet.packet_id))
    if isinstance(packet, PingReq):
        return b"\xc0\x00"
    if isinstance(packet, PingResp):
        return b"\xd0\x00"
    if isinstance(packet, Disconnect):
        return _packet(0xE0, _ack_tail(packet.reason_code, packet.properties, v5))
    if isinstance(packet, Auth):
        if not v5:
            raise LocalProtocolError("AUTH is an MQTT 5 packet")
        return _packet(0xF0, _ack_tail(packet.reason_code, packet.properties, v5))
    raise LocalProtocolError(f"not an MQTT packet: {packet!r}")


def fixed_header(first: int, length: int) -> bytes:
    """The fixed header of a packet whose body is ``length`` bytes."""
    if length < 0x80:
        return bytes((first, length))
    if length < 0x4000:
        return bytes((first, (length & 0x7F) | 0x80, length >> 7))
    return bytes((first,)) + encode_varint(length)


def _encode_publish(packet: Publish, v5: bool) -> bytes:
    qos = packet.qos
    if qos not in (0, 1, 2):
        raise LocalProtocolError(f"QoS {qos}")
    parts = [string_field(packet.topic)]
    if qos:
        if packet.packet_id is None:
            raise LocalProtocolError("QoS>0 PUBLISH needs a packet identifier")
        parts.append(packet_id_field(packet.packet_id))
    if v5:
        parts.append(_properties(packet.properties))
    parts.append(packet.payload)
    body = b"".join(parts)
    return fixed_header(0x30 | (packet.dup << 3) | (qos << 1) | int(packet.retain), len(body)) + body


def _encode_connect(c: Connect) -> bytes:
    v5 = c.protocol_level == MQTT_50
    flags = 0x02 if c.clean_start else 0
    payload = [string_field(c.client_id)]
    if c.will is not None:
        flags |= 0x04 | (c.will.qos << 3) | (c.will.retain << 5)
        if v5:
            payload.append(_properties(c.will.properties))
        payload.append(string_field(c.will.topic) + _binary(c.will.payload))
    if c.username is not None:
        flags |= 0x80
        payload.append(string_field(c.username))
    if c.password is not None:
        flags |= 0x40
        payload.append(_binary(c.password))
    header = string_field(c.protocol_name) + bytes([c.protocol_level, flags]) + struct.pack("!H", c.keepalive_s)
    if v5:
        header += _properties(c.properties)
    return _packet(0x10, header, *payload)
