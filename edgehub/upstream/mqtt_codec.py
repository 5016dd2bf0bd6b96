"""The MQTT upstream's client codec, sans I/O: the packets the hub sends to a broker as bytes, and the broker's bytes
as the packets a client receives (MQTT 3.1.1 and 5.0). ``mqtt_connection`` drives it over an asyncio transport.

It covers what the upstream speaks and nothing more: CONNECT, PUBLISH (QoS 0 and 1, MQTT 5 properties), PUBACK,
SUBSCRIBE, PINGREQ and DISCONNECT out; CONNACK, PUBLISH (QoS 0 and 1), PUBACK, SUBACK, PINGRESP and (5.0) DISCONNECT
in. The hub subscribes at QoS 1 at most, never unsubscribes and never authenticates with AUTH, so a QoS 2
PUBLISH, an UNSUBACK or an AUTH from the broker is a protocol violation.

Invariants:
* ``BrokerDecoder`` holds at most one packet's bytes: a fixed header announcing more than ``max_packet_bytes`` (the
  whole packet, as MQTT 5's Maximum Packet Size counts it) is refused before its body arrives;
* every refusal of the broker's bytes is a ``RemoteProtocolError`` whose ``reason_code`` says which (0x81 malformed,
  0x82 protocol error, 0x95 too large) and whose message names the packet; once it raised, the decoder is not fed
  again (the connection is lost);
* what we encode is valid or ``LocalProtocolError`` (a string over 65,535 bytes, a packet id out of range): our bug.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from edgehub.core import LocalProtocolError, RemoteProtocolError
from edgehub.mqtt.varint import MAX_VARINT, encode_varint

__all__ = [
    "MALFORMED",
    "PROTOCOL_ERROR",
    "TOO_LARGE",
    "BrokerDecoder",
    "ConnAckIn",
    "DisconnectIn",
    "PacketIds",
    "PingRespIn",
    "PubAckIn",
    "PublishIn",
    "PublishProperties",
    "SubAckIn",
    "connect_packet",
    "disconnect_packet",
    "pingreq_packet",
    "puback_packet",
    "publish_packet",
    "subscribe_packet",
]

MALFORMED: Final = 0x81
PROTOCOL_ERROR: Final = 0x82
TOO_LARGE: Final = 0x95

# MQTT 5 property identifiers the upstream writes or reads (section 2.2.2.2).
_CONTENT_TYPE: Final = 0x03
_CORRELATION_DATA: Final = 0x09
_SESSION_EXPIRY: Final = 0x11
_SERVER_KEEP_ALIVE: Final = 0x13
_REASON_STRING: Final = 0x1F
_USER_PROPERTY: Final = 0x26
_MAXIMUM_PACKET_SIZE: Final = 0x27
_RECEIVE_MAXIMUM: Final = 0x21

# Every property identifier MQTT 5 defines, by how its value is written: a broker may send any of them (we skip
# those we do not use), and one not in here is malformed.
_WIDTH: Final = {
    **{pid: 1 for pid in (0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A)},
    **{pid: 2 for pid in (0x13, 0x21, 0x22, 0x23)},
    **{pid: 4 for pid in (0x02, 0x11, 0x18, 0x27)},
}
_TEXT: Final = frozenset({0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F})
_BLOB: Final = frozenset({0x09, 0x16})
_VARINT_PROPS: Final = frozenset({0x0B})

_U16: Final = struct.Struct("!H")
_U32: Final = struct.Struct("!I")
_PINGREQ: Final = b"\xc0\x00"
_DISCONNECT: Final = b"\xe0\x00"  # 3.1.1, and 5.0's normal disconnection (reason 0 may be left out)


def _field(raw: bytes) -> bytes:
    """A length-prefixed field (UTF-8 string or binary data)."""
    if len(raw) > 0xFFFF:
        raise LocalProtocolError(f"field of {len(raw)} bytes is over MQTT's 65,535")
    return _U16.pack(len(raw)) + raw


def _text(value: str) -> bytes:
    return _field(value.encode())


def _with_header(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def _packet_id(pid: int) -> bytes:
    if not 0 < pid <= 0xFFFF:
        raise LocalProtocolError(f"packet id {pid} is not 1-65535")
    return _U16.pack(pid)


@dataclass(frozen=True, slots=True)
class PublishProperties:
    """The MQTT 5 properties of one of our PUBLISHes: its content type and user properties, in the order given.
    ``packed`` is their encoding without the length prefix (what ``publish_wire_bytes`` counts)."""

    user: tuple[tuple[str, str], ...] = ()
    content_type: str | None = None
    packed: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        out = bytearray()
        if self.content_type is not None:
            out.append(_CONTENT_TYPE)
            out += _text(self.content_type)
        for name, value in self.user:
            out.append(_USER_PROPERTY)
            out += _text(name) + _text(value)
        object.__setattr__(self, "packed", bytes(out))


def connect_packet(
    *,
    v5: bool,
    client_id: str,
    keepalive_s: int,
    clean: bool,
    username: str | None = None,
    password: str | None = None,
    session_expiry_s: int = 0,
    max_packet_bytes: int | None = None,
) -> bytes:
    """CONNECT. On 3.1.1 ``clean`` is clean session, on 5.0 clean start with ``session_expiry_s`` and the Maximum
    Packet Size we accept. A password without a username goes with an empty username on 3.1.1 (which has no
    password alone)."""
    if not 0 <= keepalive_s <= 0xFFFF:
        raise LocalProtocolError(f"keepalive {keepalive_s} s is not 0-65535")
    if password is not None and username is None and not v5:
        username = ""
    flags = (0x02 if clean else 0) | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = bytearray(_text("MQTT"))
    body += bytes((5 if v5 else 4, flags)) + _U16.pack(keepalive_s)
    if v5:
        props = bytearray()
        if session_expiry_s:
            props.append(_SESSION_EXPIRY)
            props += _U32.pack(session_expiry_s)
        if max_packet_bytes is not None:
            props.append(_MAXIMUM_PACKET_SIZE)
            props += _U32.pack(max_packet_bytes)
        body += encode_varint(len(props)) + props
    body += _text(client_id)
    if username is not None:
        body += _text(username)
    if password is not None:
        body += _field(password.encode())
    return _with_header(0x10, bytes(body))


def publish_packet(
    topic: str, payload: bytes, *, qos: int, packet_id: int = 0, v5: bool, props: PublishProperties | None = None
) -> bytes:
    """PUBLISH at QoS 0 or 1 (``packet_id`` for QoS 1). Its length is ``mqtt_wire.publish_wire_bytes``'s."""
    head = bytearray(_text(topic))
    if qos:
        head += _packet_id(packet_id)
    if v5:
        packed = props.packed if props is not None else b""
        head += encode_varint(len(packed)) + packed
    size = len(head) + len(payload)
    if size > MAX_VARINT:
        raise LocalProtocolError(f"PUBLISH of {size} bytes is over MQTT's limit")
    return bytes((0x32 if qos else 0x30,)) + encode_varint(size) + head + payload


def puback_packet(packet_id: int) -> bytes:
    """PUBACK, success (MQTT 5 lets the reason code 0 be left out: the same bytes on both versions)."""
    return b"\x40\x02" + _packet_id(packet_id)


def subscribe_packet(packet_id: int, filters: Sequence[tuple[str, int]], *, v5: bool) -> bytes:
    """SUBSCRIBE to ``filters`` (each with its maximum QoS; MQTT 5's other options at their defaults)."""
    if not filters:
        raise LocalProtocolError("SUBSCRIBE needs at least one filter")
    body = bytearray(_packet_id(packet_id))
    if v5:
        body.append(0)  # no properties
    for topic_filter, qos in filters:
        body += _text(topic_filter)
        body.append(qos)
    return _with_header(0x82, bytes(body))


class PacketIds:
    """Packet ids 1-65535 in turn, never one still in use (awaiting its ack): ``take(in_use)``, None when all are."""

    __slots__ = ("_last",)

    def __init__(self, last: int = 0) -> None:
        self._last = last

    def take(self, in_use: Callable[[int], bool]) -> int | None:
        for _ in range(0xFFFF):
            self._last = self._last % 0xFFFF + 1
            if not in_use(self._last):
                return self._last
        return None


def pingreq_packet() -> bytes:
    return _PINGREQ


def disconnect_packet() -> bytes:
    return _DISCONNECT


# -- what the broker sends ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnAckIn:
    session_present: bool
    code: int  # 3.1.1 return code or 5.0 reason code; 0 is success
    server_keepalive_s: int | None = None  # 5.0: the broker's keep alive, which replaces ours
    reason: str | None = None  # 5.0 reason string
    receive_maximum: int | None = None  # 5.0: QoS 1 PUBLISHes the broker takes unacknowledged at once
    maximum_packet_size: int | None = None  # 5.0: the largest packet the broker takes, in bytes

    @property
    def refused(self) -> bool:
        return self.code != 0


@dataclass(frozen=True, slots=True)
class PubAckIn:
    packet_id: int
    code: int = 0  # 5.0 reason code; >= 0x80 is a failure
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class SubAckIn:
    packet_id: int
    codes: bytes  # one granted QoS (or failure >= 0x80) per filter


@dataclass(frozen=True, slots=True)
class PublishIn:
    topic: str
    payload: bytes
    qos: int
    packet_id: int  # 0 for QoS 0
    user_properties: tuple[tuple[str, str], ...] = ()
    content_type: str | None = None
    correlation_data: bytes | None = None


@dataclass(frozen=True, slots=True)
class PingRespIn:
    pass


@dataclass(frozen=True, slots=True)
class DisconnectIn:
    code: int
    reason: str | None = None


BrokerPacket = ConnAckIn | PubAckIn | SubAckIn | PublishIn | PingRespIn | DisconnectIn
_PINGRESP: Final = PingRespIn()


class _Body:
    """A cursor over one packet's body; every read past its end is malformed."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def bad(self, why: str, code: int = MALFORMED) -> RemoteProtocolError:
        return RemoteProtocolError(f"{self.what}: {why}", reason_code=code)

    def left(self) -> int:
        return len(self.data) - self.pos

    def read(self, n: int) -> bytes:
        if self.left() < n:
            raise self.bad("ends early")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self) -> int:
        return self.read(1)[0]

    def u16(self) -> int:
        value: int = _U16.unpack(self.read(2))[0]
        return value

    def u32(self) -> int:
        value: int = _U32.unpack(self.read(4))[0]
        return value

    def varint(self) -> int:
        value = shift = 0
        for _ in range(4):
            byte = self.u8()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise self.bad("variable byte integer over four bytes")

    def blob(self) -> bytes:
        return self.read(self.u16())

    def text(self) -> str:
        raw = self.blob()
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise self.bad("a string that is not UTF-8") from None

    def properties(self) -> tuple[dict[int, int | str | bytes], tuple[tuple[str, str], ...]]:
        """MQTT 5 properties: the single-valued ones by identifier, and the user properties in order."""
        size = self.varint()
        if size > self.left():
            raise self.bad("properties longer than the packet")
        end = self.pos + size
        values: dict[int, int | str | bytes] = {}
        user: list[tuple[str, str]] = []
        while self.pos < end:
            pid = self.varint()
            if pid == _USER_PROPERTY:
                user.append((self.text(), self.text()))
                continue
            width = _WIDTH.get(pid)
            if width is not None:
                values[pid] = int.from_bytes(self.read(width), "big")
            elif pid in _TEXT:
                values[pid] = self.text()
            elif pid in _BLOB:
                values[pid] = self.blob()
            elif pid in _VARINT_PROPS:
                values[pid] = self.varint()
            else:
                raise self.bad(f"unknown property 0x{pid:02x}")
        if self.pos != end:
            raise self.bad("a property runs past the properties' length")
        return values, tuple(user)

    def finished(self) -> None:
        if self.left():
            raise self.bad(f"{self.left()} bytes after the packet's fields")


def _optional_positive(r: _Body, values: dict[int, int | str | bytes], pid: int, name: str) -> int | None:
    """An integer property that may be left out but is never 0 (MQTT 5, 3.2.2.3.3 and 3.2.2.3.6)."""
    value = values.get(pid)
    if value == 0:
        raise r.bad(f"{name} of 0", PROTOCOL_ERROR)
    return value if isinstance(value, int) else None


def _optional_text(values: dict[int, int | str | bytes], pid: int) -> str | None:
    value = values.get(pid)
    return value if isinstance(value, str) else None


class BrokerDecoder:
    """Bytes from the broker in (``feed``), the complete packets among them out; keeps a partial packet."""

    def __init__(self, *, v5: bool, max_packet_bytes: int) -> None:
        self.v5 = v5
        self.max_packet_bytes = max_packet_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[BrokerPacket]:
        """The packets ``data`` completes, in order; raises ``RemoteProtocolError`` on bytes that are not one."""
        buf = self._buf
        buf += data
        out: list[BrokerPacket] = []
        pos = 0
        while True:
            header = self._header(buf, pos)
            if header is None:
                break
            first, start, end = header
            if end > len(buf):
                break
            out.append(self._packet(first, bytes(buf[start:end])))
            pos = end
        del buf[:pos]
        return out

    def _header(self, buf: bytearray, pos: int) -> tuple[int, int, int] | None:
        """The first byte, body start and body end of the packet at ``pos``; None until its header is complete."""
        size = shift = 0
        for i in range(1, 5):
            if pos + i >= len(buf):
                return None
            byte = buf[pos + i]
            size |= (byte & 0x7F) << shift
            if not byte & 0x80:
                total = 1 + i + size
                if total > self.max_packet_bytes:
                    raise RemoteProtocolError(
                        f"packet of {total} bytes is over the limit of {self.max_packet_bytes}", reason_code=TOO_LARGE
                    )
                return buf[pos], pos + 1 + i, pos + total
            shift += 7
        raise RemoteProtocolError("remaining length over four bytes", reason_code=MALFORMED)

    def _packet(self, first: int, body: bytes) -> BrokerPacket:
        kind, flags = first >> 4, first & 0x0F
        if kind == 3:
            return self._publish(flags, _Body(body, "PUBLISH"))
        what = _NAMES.get(kind)
        if what is None:
            raise RemoteProtocolError(f"packet type {kind} is not one a broker sends a client", reason_code=MALFORMED)
        r = _Body(body, what)
        if flags:
            raise r.bad(f"reserved flags 0x{flags:x}")
        if kind == 4:
            return self._puback(r)
        if kind == 2:
            return self._connack(r)
        if kind == 9:
            return self._suback(r)
        if kind == 13:
            r.finished()
            return _PINGRESP
        if kind == 14 and self.v5:
            return self._disconnect(r)
        raise r.bad("not expected by this client", PROTOCOL_ERROR)

    def _connack(self, r: _Body) -> ConnAckIn:
        ack_flags = r.u8()
        if ack_flags & 0xFE:
            raise r.bad(f"reserved acknowledge flags 0x{ack_flags:x}")
        code = r.u8()
        keepalive: int | None = None
        receive_maximum: int | None = None
        maximum_packet_size: int | None = None
        reason: str | None = None
        if self.v5:
            values, _ = r.properties()
            ka = values.get(_SERVER_KEEP_ALIVE)
            keepalive = ka if isinstance(ka, int) else None
            reason = _optional_text(values, _REASON_STRING)
            receive_maximum = _optional_positive(r, values, _RECEIVE_MAXIMUM, "Receive Maximum")
            maximum_packet_size = _optional_positive(r, values, _MAXIMUM_PACKET_SIZE, "Maximum Packet Size")
        r.finished()
        return ConnAckIn(bool(ack_flags & 1), code, keepalive, reason, receive_maximum, maximum_packet_size)

    def _puback(self, r: _Body) -> PubAckIn:
        pid = r.u16()
        code, reason = 0, None
        if self.v5 and r.left():
            code = r.u8()
            if r.left():
                reason = _optional_text(r.properties()[0], _REASON_STRING)
        r.finished()
        return PubAckIn(pid, code, reason)

    def _suback(self, r: _Body) -> SubAckIn:
        pid = r.u16()
        if self.v5:
            r.properties()
        codes = r.read(r.left())
        if not codes:
            raise r.bad("no return codes")
        return SubAckIn(pid, codes)

    def _disconnect(self, r: _Body) -> DisconnectIn:
        code, reason = 0, None
        if r.left():
            code = r.u8()
            if r.left():
                reason = _optional_text(r.properties()[0], _REASON_STRING)
        r.finished()
        return DisconnectIn(code, reason)

    def _publish(self, flags: int, r: _Body) -> PublishIn:
        qos = (flags >> 1) & 3
        if qos == 3:
            raise r.bad("QoS 3")
        if qos == 2:
            raise r.bad("QoS 2, above every subscription of ours", PROTOCOL_ERROR)
        topic = r.text()
        pid = r.u16() if qos else 0
        if qos and not pid:
            raise r.bad("packet id 0")
        user: tuple[tuple[str, str], ...] = ()
        content_type: str | None = None
        correlation: bytes | None = None
        if self.v5:
            values, user = r.properties()
            content_type = _optional_text(values, _CONTENT_TYPE)
            data = values.get(_CORRELATION_DATA)
            correlation = data if isinstance(data, bytes) else None
        if not topic:
            raise r.bad("an empty topic (we allow no topic aliases)", PROTOCOL_ERROR)
        return PublishIn(topic, r.read(r.left()), qos, pid, user, content_type, correlation)


_NAMES: Final = {
    2: "CONNACK", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL", 7: "PUBCOMP", 9: "SUBACK", 11: "UNSUBACK",
    13: "PINGRESP", 14: "DISCONNECT", 15: "AUTH",
}  # fmt: skip
