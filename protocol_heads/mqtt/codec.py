"""Sans-IO MQTT 3.1.1 and 5.0 codec: bytes in, packets out; packets in, bytes out. No I/O, no state machine.

``Decoder.receive_data(data)`` returns every complete packet in the bytes received so far, in order, so that
all PUBLISHes of one socket read reach the hub as one group. ``encode(packet, version)`` returns wire bytes.

Invariants:
* The decoder raises only ``MalformedPacket`` (0x81), ``PacketTooLarge`` (0x95) and
  ``ProtocolViolation`` (0x82), all ``RemoteProtocolError``s carrying the MQTT 5 reason code. After it has
  raised, the decoder is dead (every further call raises again): a broken stream cannot be resynchronised.
* ``encode`` raises only ``LocalProtocolError`` (a value that cannot be put on the wire).
* The protocol version is learned from CONNECT (server side) or given up front (client side); before it is
  known, only CONNECT can be decoded.

Errors::

    RemoteProtocolError (edgehub.core)
    ├── MalformedPacket      bytes that are not MQTT (reason 0x81)
    ├── ProtocolViolation    well-formed but forbidden (reason 0x82)
    └── PacketTooLarge       over the maximum packet size (reason 0x95)
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import msgspec

from edgehub.core import LocalProtocolError, RemoteProtocolError
from protocol_heads.mqtt.caches import BudgetDict

__all__ = [
    "MAX_VARINT",
    "MQTT_50",
    "MQTT_311",
    "NO_PROPERTIES",
    "TOPIC_CACHE_BYTES",
    "Auth",
    "ConnAck",
    "Connect",
    "Decoder",
    "Disconnect",
    "MalformedPacket",
    "Packet",
    "PacketTooLarge",
    "PacketType",
    "PingReq",
    "PingResp",
    "Properties",
    "PropertyId",
    "ProtocolViolation",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "ReasonCode",
    "SubAck",
    "Subscribe",
    "Subscription",
    "UnsubAck",
    "Unsubscribe",
    "Will",
    "decode_varint",
    "encode",
    "encode_qos1_publish",
    "encode_varint",
]

MQTT_311: Final = 4
MQTT_50: Final = 5
MAX_VARINT: Final = 268_435_455
_MAX_U16: Final = 0xFFFF
_U16: Final = struct.Struct("!H")


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class ReasonCode(IntEnum):
    """MQTT 5 reason codes (also the 3.1.1 CONNACK return codes 0..5, which share the low values)."""

    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    # 3.1.1 CONNACK return codes.
    V3_UNACCEPTABLE_PROTOCOL_VERSION = 0x01
    V3_IDENTIFIER_REJECTED = 0x02
    V3_SERVER_UNAVAILABLE = 0x03
    V3_BAD_USERNAME_OR_PASSWORD = 0x04
    V3_NOT_AUTHORIZED = 0x05
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    REAUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USERNAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class MalformedPacket(RemoteProtocolError):
    """The bytes are not a valid MQTT packet."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason_code=ReasonCode.MALFORMED_PACKET)


class ProtocolViolation(RemoteProtocolError):
    """A well-formed packet the protocol forbids here."""

    def __init__(self, message: str, *, reason_code: int = ReasonCode.PROTOCOL_ERROR) -> None:
        super().__init__(message, reason_code=reason_code)


class PacketTooLarge(RemoteProtocolError):
    """A packet over the maximum packet size this side accepts."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason_code=ReasonCode.PACKET_TOO_LARGE)


class PropertyId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


# Wire type of each property: b byte, h u16, i u32, v varint, s UTF-8 string, d binary data, p string pair.
_PROPERTY_KIND: Final[Mapping[int, str]] = {
    PropertyId.PAYLOAD_FORMAT_INDICATOR: "b",
    PropertyId.MESSAGE_EXPIRY_INTERVAL: "i",
    PropertyId.CONTENT_TYPE: "s",
    PropertyId.RESPONSE_TOPIC: "s",
    PropertyId.CORRELATION_DATA: "d",
    PropertyId.SUBSCRIPTION_IDENTIFIER: "v",
    PropertyId.SESSION_EXPIRY_INTERVAL: "i",
    PropertyId.ASSIGNED_CLIENT_IDENTIFIER: "s",
    PropertyId.SERVER_KEEP_ALIVE: "h",
    PropertyId.AUTHENTICATION_METHOD: "s",
    PropertyId.AUTHENTICATION_DATA: "d",
    PropertyId.REQUEST_PROBLEM_INFORMATION: "b",
    PropertyId.WILL_DELAY_INTERVAL: "i",
    PropertyId.REQUEST_RESPONSE_INFORMATION: "b",
    PropertyId.RESPONSE_INFORMATION: "s",
    PropertyId.SERVER_REFERENCE: "s",
    PropertyId.REASON_STRING: "s",
    PropertyId.RECEIVE_MAXIMUM: "h",
    PropertyId.TOPIC_ALIAS_MAXIMUM: "h",
    PropertyId.TOPIC_ALIAS: "h",
    PropertyId.MAXIMUM_QOS: "b",
    PropertyId.RETAIN_AVAILABLE: "b",
    PropertyId.USER_PROPERTY: "p",
    PropertyId.MAXIMUM_PACKET_SIZE: "i",
    PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE: "b",
    PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE: "b",
    PropertyId.SHARED_SUBSCRIPTION_AVAILABLE: "b",
}

PropertyValue = int | str | bytes


# A msgspec Struct, not a dataclass: one is built for every message, and its C __init__ takes an eighth of the
# time of a frozen dataclass's (no reference cycles go through it, hence gc=False).
class Properties(msgspec.Struct, frozen=True, gc=False):
    """MQTT 5 properties of one packet. ``values`` holds every property but user properties (each at most
    once, except subscription identifiers, whose last value is kept); ``user`` holds the user properties in
    wire order (names may repeat). Empty for MQTT 3.1.1."""

    values: Mapping[PropertyId, PropertyValue] = msgspec.field(default_factory=dict)
    user: tuple[tuple[str, str], ...] = ()

    def get_int(self, pid: PropertyId) -> int | None:
        v = self.values.get(pid)
        return v if isinstance(v, int) else None

    def get_str(self, pid: PropertyId) -> str | None:
        v = self.values.get(pid)
        return v if isinstance(v, str) else None

    def get_bytes(self, pid: PropertyId) -> bytes | None:
        v = self.values.get(pid)
        return v if isinstance(v, bytes) else None

    def __bool__(self) -> bool:
        return bool(self.values) or bool(self.user)


NO_PROPERTIES: Final = Properties()


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    protocol_level: int = MQTT_311
    keepalive_s: int = 60
    clean_start: bool = True
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES
    protocol_name: str = "MQTT"


@dataclass(frozen=True, slots=True)
class ConnAck:
    reason_code: int = 0
    session_present: bool = False
    properties: Properties = NO_PROPERTIES


# A msgspec Struct, as above: built for every message.
class Publish(msgspec.Struct, frozen=True, gc=False):
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES


# A msgspec Struct, as above: built for every message.
class PubAck(msgspec.Struct, frozen=True, gc=False):
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubRec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubRel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubComp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Subscription:
    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class UnsubAck:
    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PingReq:
    pass


@dataclass(frozen=True, slots=True)
class PingResp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)


# ---------------------------------------------------------------------------------------------------------
# Variable byte integers


def encode_varint(value: int) -> bytes:
    """The MQTT variable byte integer for ``value`` (0 .. 268,435,455)."""
    if not 0 <= value <= MAX_VARINT:
        raise LocalProtocolError(f"varint out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int] | None:
    """``(value, next_pos)``, or None when the bytes end before the integer does. Raises MalformedPacket
    for a fifth continuation byte."""
    value = 0
    for i in range(4):
        if pos + i >= len(data):
            return None
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos + i + 1
    raise MalformedPacket("variable byte integer longer than 4 bytes")


# ---------------------------------------------------------------------------------------------------------
# Decoding


class _Reader:
    """Reads fields from one packet body; every overrun is a MalformedPacket."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise MalformedPacket("packet ends inside a field")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        if self.pos >= self.end:
            raise MalformedPacket("packet ends inside a field")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def u16(self) -> int:
        value: int = struct.unpack_from("!H", self.take(2))[0]
        return value

    def u32(self) -> int:
        value: int = struct.unpack_from("!I", self.take(4))[0]
        return value

    def packet_id(self) -> int:
        # Non-zero in every packet that has one [MQTT-2.2.1-3]: the server answers SUBSCRIBE, UNSUBSCRIBE and
        # PUBREL with the same id, and 0 cannot be encoded (found by fuzzing: the answer raised).
        pid = self.u16()
        if pid == 0:
            raise ProtocolViolation("packet identifier 0")
        return pid

    def varint(self) -> int:
        got = decode_varint(self.buf[: self.end], self.pos)
        if got is None:
            raise MalformedPacket("packet ends inside a variable byte integer")
        value, self.pos = got
        return value

    def binary(self) -> bytes:
        return self.take(self.u16())

    def string(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedPacket("string is not valid UTF-8") from exc
        # MQTT forbids U+0000 in strings [MQTT-1.5.4-2].
        if "\x00" in text:
            raise MalformedPacket("string contains U+0000")
        return text

    def properties(self) -> Properties:
        length = self.varint()
        if length > self.remaining():
            raise MalformedPacket("property length past the end of the packet")
        end = self.pos + length
        values: dict[PropertyId, PropertyValue] = {}
        user: list[tuple[str, str]] = []
        sub = _Reader(self.buf, self.pos, end)
        while sub.remaining():
            raw_id = sub.varint()
            kind = _PROPERTY_KIND.get(raw_id)
            if kind is None:
                raise MalformedPacket(f"unknown property id 0x{raw_id:02x}")
            pid = PropertyId(raw_id)
            value: PropertyValue
            if kind == "p":
                user.append((sub.string(), sub.string()))
                continue
            if kind == "b":
                value = sub.u8()
            elif kind == "h":
                value = sub.u16()
            elif kind == "i":
                value = sub.u32()
            elif kind == "v":
                value = sub.varint()
            elif kind == "s":
                value = sub.string()
            else:
                value = sub.binary()
            if pid in values and pid is not PropertyId.SUBSCRIPTION_IDENTIFIER:
                raise ProtocolViolation(f"property {pid.name} appears twice")
            values[pid] = value
        self.pos = end
        return Properties(values, tuple(user))

    def done(self, what: str) -> None:
        if self.pos != self.end:
            raise MalformedPacket(f"{what} has {self.end - self.pos} trailing bytes")


_EXPECTED_FLAGS: Final[Mapping[int, int]] = {
    PacketType.CONNECT: 0,
    PacketType.CONNACK: 0,
    PacketType.PUBACK: 0,
    PacketType.PUBREC: 0,
    PacketType.PUBREL: 2,
    PacketType.PUBCOMP: 0,
    PacketType.SUBSCRIBE: 2,
    PacketType.SUBACK: 0,
    PacketType.UNSUBSCRIBE: 2,
    PacketType.UNSUBACK: 0,
    PacketType.PINGREQ: 0,
    PacketType.PINGRESP: 0,
    PacketType.DISCONNECT: 0,
    PacketType.AUTH: 0,
}


# Per connection and per topic cache (decoder: topic bytes → str; encoder: topic → wire bytes): 32 KiB holds
# some 100 topics of a device's usual length, and topics of up to ~4 KB. An entry is priced at its text twice plus
# a dict slot's and two objects' overhead.
TOPIC_CACHE_BYTES: Final = 32 * 1024
_ENTRY_OVERHEAD: Final = 128


class Decoder:
    """Splits a byte stream into packets. Feed it with ``receive_data``; it returns complete packets.

    ``max_packet_size`` bounds a whole packet (fixed header included), as MQTT 5's Maximum Packet Size does;
    a larger announced length raises ``PacketTooLarge`` before the body is buffered.
    """

    def __init__(
        self,
        *,
        protocol_level: int | None = None,
        max_packet_size: int = MAX_VARINT + 5,
        topic_cache_bytes: int = TOPIC_CACHE_BYTES,
    ) -> None:
        if protocol_level not in (None, MQTT_311, MQTT_50):
            raise ValueError(f"unsupported protocol level {protocol_level}")
        if max_packet_size < 2:
            raise ValueError("max_packet_size must be at least 2")
        self.protocol_level = protocol_level
        self.max_packet_size = max_packet_size
        self._buf = bytearray()
        self._error: RemoteProtocolError | None = None
        # Topic bytes → topic, for topics that decoded without error; this connection's, bounded in bytes.
        self._topics: BudgetDict[bytes, str] = BudgetDict(topic_cache_bytes)

    def puback_ids(self, data: bytes) -> list[int] | None:
        """The packet ids of ``data`` if it is nothing but whole PUBACKs that carry only a packet id (``40 02``
        and the id: MQTT 3.1.1, and MQTT 5's success), with nothing buffered before it; else None, and nothing
        is consumed: ``receive_data`` then decodes it the general way.

        A module that acks its deliveries sends little else, in reads of a few PUBACKs each: this reads them
        without a packet object each (bench.ingest's sink: about one such read per two messages)."""
        n = len(data)
        if self._buf or self._error is not None or self.protocol_level is None or not n or n & 3:
            return None
        k = n >> 2
        if data[0::4] != b"\x40" * k or data[1::4] != b"\x02" * k:
            return None
        return [(data[i] << 8) | data[i + 1] for i in range(2, n, 4)]

    def discard_partial(self) -> None:
        """Forget the bytes of a packet not yet complete: the connection takes no more reads (they may be most of
        a 256 KB CONNECT, held otherwise until the decoder is freed)."""
        self._buf = bytearray()

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Every complete packet so far, in order. Partial bytes stay buffered for the next call."""
        if self._error is not None:
            raise self._error
        # Parse straight from ``data`` when nothing is left over from the last call (the common case): slices
        # of bytes are bytes, so a packet's fields are copied once.
        buf: bytes | bytearray
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data if type(data) is bytes else bytes(data)
        packets: list[Packet] = []
        n = len(buf)
        pos = 0
        known = self.protocol_level is not None
        try:
            while n - pos >= 2:
                length = buf[pos + 1]
                if length < 0x80:  # a one-byte remaining length: every packet under 128 bytes
                    body = pos + 2
                elif n - pos >= 3 and buf[pos + 2] < 0x80:  # two bytes: under 16 KiB (a 200-byte telemetry PUBLISH)
                    length = (length & 0x7F) | (buf[pos + 2] << 7)
                    body = pos + 3
                else:
                    got = decode_varint(buf, pos + 1)
                    if got is None:
                        break
                    length, body = got
                end = body + length
                if end - pos > self.max_packet_size:
                    raise PacketTooLarge(f"packet of {end - pos} bytes over the maximum of {self.max_packet_size}")
                if n < end:
                    break
                first = buf[pos]
                if first >> 4 == PacketType.PUBLISH and known:
                    packets.append(self._publish_fast(first, buf, body, end))
                elif first == 0x40 and length == 2 and known:  # PUBACK with a packet id only
                    packets.append(PubAck((buf[body] << 8) | buf[body + 1]))
                else:
                    packets.append(self._decode(first, bytes(buf[body:end])))
                    known = self.protocol_level is not None
                pos = end
        except RemoteProtocolError as exc:
            self._error = exc
            raise
        if buf is self._buf:
            del self._buf[:pos]
        elif pos < n:
            self._buf += buf[pos:]
        return packets

    def _publish_fast(self, first: int, buf: bytes | bytearray, body: int, end: int) -> Publish:
        """A PUBLISH whose topic was seen before and that has no MQTT 5 properties, read in place; anything
        else (a new topic, properties, any error) goes the general way, which also validates a new topic once.

        Per message this was a third of the head's decoding cost: a reader object, two copies of the body, the
        topic decoded and checked for U+0000 and wildcards every time."""
        flags = first & 0x0F
        qos = (flags >> 1) & 0x03
        p = body + 2
        if qos == 3 or p > end:
            return self._publish_general(first, buf, body, end)
        topic_end = p + ((buf[body] << 8) | buf[body + 1])
        if topic_end > end:
            return self._publish_general(first, buf, body, end)
        raw = buf[p:topic_end]
        topic = self._topics.get(raw if type(raw) is bytes else bytes(raw))
        if topic is None:
            return self._publish_general(first, buf, body, end)
        p = topic_end
        packet_id = None
        if qos:
            if p + 2 > end:
                return self._publish_general(first, buf, body, end)
            packet_id = (buf[p] << 8) | buf[p + 1]
            if packet_id == 0:
                return self._publish_general(first, buf, body, end)
            p += 2
        elif flags & 0x08:  # DUP on QoS 0
            return self._publish_general(first, buf, body, end)
        if self.protocol_level == MQTT_50:
            if p >= end or buf[p] != 0:  # properties present: the general reader
                return self._publish_general(first, buf, body, end)
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

    def _publish_general(self, first: int, buf: bytes | bytearray, body: int, end: int) -> Publish:
        packet = self._decode(first, bytes(buf[body:end]))
        assert isinstance(packet, Publish)
        # The topic is valid (it decoded): remember it, so that the next PUBLISH on it takes the fast path.
        raw = packet.topic.encode()
        self._topics.remember(raw, packet.topic, _ENTRY_OVERHEAD + 2 * len(raw))
        return packet

    def _decode(self, first: int, body: bytes) -> Packet:
        ptype, flags = first >> 4, first & 0x0F
        if ptype == 0:
            raise MalformedPacket("packet type 0 is reserved")
        if ptype != PacketType.PUBLISH and _EXPECTED_FLAGS[ptype] != flags:
            raise MalformedPacket(f"{PacketType(ptype).name} with reserved flags 0x{flags:x}")
        if ptype == PacketType.CONNECT:
            return self._connect(body)
        if self.protocol_level is None:
            raise ProtocolViolation(f"{PacketType(ptype).name} before CONNECT")
        v5 = self.protocol_level == MQTT_50
        r = _Reader(body)
        packet: Packet
        if ptype == PacketType.PUBLISH:
            packet = self._publish(flags, r, v5)
        elif ptype in (PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP):
            pid = r.packet_id()
            rc = 0
            props = NO_PROPERTIES
            if v5 and r.remaining():
                rc = r.u8()
                if r.remaining():
                    props = r.properties()
            if ptype == PacketType.PUBACK:
                packet = PubAck(pid, rc, props)
            elif ptype == PacketType.PUBREC:
                packet = PubRec(pid, rc, props)
            elif ptype == PacketType.PUBREL:
                packet = PubRel(pid, rc, props)
            else:
                packet = PubComp(pid, rc, props)
        elif ptype == PacketType.SUBSCRIBE:
            pid = r.packet_id()
            props = r.properties() if v5 else NO_PROPERTIES
            subs: list[Subscription] = []
            while r.remaining():
                topic = r.string()
                opts = r.u8()
                qos = opts & 0x03
                if qos == 3:
                    raise MalformedPacket("subscription QoS 3")
                if v5:
                    if opts & 0xC0 or (opts >> 4) & 0x03 == 3:
                        raise MalformedPacket("reserved subscription option bits")
                    subs.append(Subscription(topic, qos, bool(opts & 4), bool(opts & 8), (opts >> 4) & 3))
                else:
                    if opts & 0xFC:
                        raise MalformedPacket("reserved subscription option bits")
                    subs.append(Subscription(topic, qos))
            if not subs:
                raise ProtocolViolation("SUBSCRIBE without a topic filter")
            packet = Subscribe(pid, tuple(subs), props)
        elif ptype == PacketType.SUBACK:
            pid = r.packet_id()
            props = r.properties() if v5 else NO_PROPERTIES
            packet = SubAck(pid, tuple(r.take(r.remaining())), props)
        elif ptype == PacketType.UNSUBSCRIBE:
            pid = r.packet_id()
            props = r.properties() if v5 else NO_PROPERTIES
            filters: list[str] = []
            while r.remaining():
                filters.append(r.string())
            if not filters:
                raise ProtocolViolation("UNSUBSCRIBE without a topic filter")
            packet = Unsubscribe(pid, tuple(filters), props)
        elif ptype == PacketType.UNSUBACK:
            pid = r.packet_id()
            props = r.properties() if v5 else NO_PROPERTIES
            packet = UnsubAck(pid, tuple(r.take(r.remaining())) if v5 else (), props)
        elif ptype == PacketType.CONNACK:
            ack_flags = r.u8()
            if ack_flags & 0xFE:
                raise MalformedPacket("reserved CONNACK flags")
            rc = r.u8()
            props = r.properties() if v5 else NO_PROPERTIES
            packet = ConnAck(rc, bool(ack_flags & 1), props)
        elif ptype == PacketType.PINGREQ:
            packet = PingReq()
        elif ptype == PacketType.PINGRESP:
            packet = PingResp()
        elif ptype == PacketType.DISCONNECT:
            rc = 0
            props = NO_PROPERTIES
            if v5 and r.remaining():
                rc = r.u8()
                if r.remaining():
                    props = r.properties()
            packet = Disconnect(rc, props)
        else:  # AUTH
            if not v5:
                raise MalformedPacket("AUTH is an MQTT 5 packet")
            rc = 0
            props = NO_PROPERTIES
            if r.remaining():
                rc = r.u8()
                if r.remaining():
                    props = r.properties()
            packet = Auth(rc, props)
        r.done(type(packet).__name__.upper())
        return packet

    def _publish(self, flags: int, r: _Reader, v5: bool) -> Publish:
        qos = (flags >> 1) & 0x03
        if qos == 3:
            raise MalformedPacket("PUBLISH with QoS 3")
        dup = bool(flags & 0x08)
        if dup and qos == 0:
            raise MalformedPacket("PUBLISH QoS 0 with DUP set")
        topic = r.string()
        packet_id = None
        if qos:
            packet_id = r.u16()
            if packet_id == 0:
                raise ProtocolViolation("packet identifier 0")
        props = r.properties() if v5 else NO_PROPERTIES
        if "+" in topic or "#" in topic:
            raise ProtocolViolation("wildcard in a topic name", reason_code=ReasonCode.TOPIC_NAME_INVALID)
        return Publish(topic, r.take(r.remaining()), qos, bool(flags & 1), dup, packet_id, props)

    def _connect(self, body: bytes) -> Connect:
        if self.protocol_level is not None and self._seen_connect:
            raise ProtocolViolation("second CONNECT")
        r = _Reader(body)
        name = r.string()
        level = r.u8()
        if name != "MQTT" or level not in (MQTT_311, MQTT_50):
            raise ProtocolViolation(
                f"unsupported protocol {name!r} level {level}", reason_code=ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
            )
        self.protocol_level = level
        self._seen_connect = True
        v5 = level == MQTT_50
        cflags = r.u8()
        if cflags & 0x01:
            raise MalformedPacket("reserved CONNECT flag set")
        keepalive = r.u16()
        props = r.properties() if v5 else NO_PROPERTIES
        client_id = r.string()
        will = None
        will_flag = bool(cflags & 0x04)
        will_qos = (cflags >> 3) & 0x03
        will_retain = bool(cflags & 0x20)
        if not will_flag and (will_qos or will_retain):
            raise MalformedPacket("will QoS or retain without a will")
        if will_qos == 3:
            raise MalformedPacket("will QoS 3")
        if will_flag:
            will_props = r.properties() if v5 else NO_PROPERTIES
            will_topic = r.string()
            will = Will(will_topic, r.binary(), will_qos, will_retain, will_props)
        username = r.string() if cflags & 0x80 else None
        if cflags & 0x40 and not v5 and username is None:
            raise MalformedPacket("password without a username")
        password = r.binary() if cflags & 0x40 else None
        r.done("CONNECT")
        return Connect(client_id, level, keepalive, bool(cflags & 0x02), username, password, will, props, name)

    _seen_connect = False


# ---------------------------------------------------------------------------------------------------------
# Encoding


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > _MAX_U16:
        raise LocalProtocolError(f"string of {len(raw)} bytes is too long for MQTT")
    return struct.pack("!H", len(raw)) + raw


def _binary(data: bytes) -> bytes:
    if len(data) > _MAX_U16:
        raise LocalProtocolError(f"binary field of {len(data)} bytes is too long for MQTT")
    return struct.pack("!H", len(data)) + data


def _properties(props: Properties) -> bytes:
    out = bytearray()
    for pid, value in props.values.items():
        kind = _PROPERTY_KIND[pid]
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
            out += _string(value)
        else:
            if not isinstance(value, bytes):
                raise LocalProtocolError(f"property {pid.name} needs bytes")
            out += _binary(value)
    for name, value in props.user:
        out += b"\x26" + _string(name) + _string(value)
    return encode_varint(len(out)) + out


def _packet(first: int, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return bytes([first]) + encode_varint(len(body)) + body


def _ack_tail(reason_code: int, props: Properties, v5: bool, *, short_ok: bool = True) -> bytes:
    """MQTT 5 lets an ack drop the reason code when it is 0 and no properties follow."""
    if not v5:
        return b""
    if props:
        return bytes([reason_code]) + _properties(props)
    if reason_code == 0 and short_ok:
        return b""
    return bytes([reason_code])


def _pid(packet_id: int) -> bytes:
    if not 1 <= packet_id <= _MAX_U16:
        raise LocalProtocolError(f"packet identifier {packet_id} out of range")
    return struct.pack("!H", packet_id)


def encode(packet: Packet, protocol_level: int = MQTT_311) -> bytes:
    """Wire bytes of ``packet`` for ``protocol_level`` (4: 3.1.1, 5: 5.0). CONNECT uses its own level."""
    v5 = protocol_level == MQTT_50
    if type(packet) is Publish:
        return _encode_publish(packet, v5)
    if isinstance(packet, PubAck | PubRec | PubRel | PubComp):
        first = {PubAck: 0x40, PubRec: 0x50, PubRel: 0x62, PubComp: 0x70}[type(packet)]
        return _packet(first, _pid(packet.packet_id), _ack_tail(packet.reason_code, packet.properties, v5))
    if isinstance(packet, Connect):
        return _encode_connect(packet)
    if isinstance(packet, ConnAck):
        tail = _properties(packet.properties) if v5 else b""
        return _packet(0x20, bytes([int(packet.session_present), packet.reason_code]), tail)
    if isinstance(packet, Subscribe):
        parts = [_pid(packet.packet_id)]
        if v5:
            parts.append(_properties(packet.properties))
        for s in packet.subscriptions:
            opts = s.qos
            if v5:
                opts |= (s.no_local << 2) | (s.retain_as_published << 3) | (s.retain_handling << 4)
            parts.append(_string(s.topic_filter) + bytes([opts]))
        return _packet(0x82, *parts)
    if isinstance(packet, SubAck):
        props = _properties(packet.properties) if v5 else b""
        return _packet(0x90, _pid(packet.packet_id), props, bytes(packet.reason_codes))
    if isinstance(packet, Unsubscribe):
        props = _properties(packet.properties) if v5 else b""
        return _packet(0xA2, _pid(packet.packet_id), props, *(_string(t) for t in packet.topic_filters))
    if isinstance(packet, UnsubAck):
        if v5:
            return _packet(0xB0, _pid(packet.packet_id), _properties(packet.properties), bytes(packet.reason_codes))
        return _packet(0xB0, _pid(packet.packet_id))
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


def _fixed_header(first: int, length: int) -> bytes:
    if length < 0x80:
        return bytes((first, length))
    if length < 0x4000:
        return bytes((first, (length & 0x7F) | 0x80, length >> 7))
    return bytes((first,)) + encode_varint(length)


def _encode_publish(packet: Publish, v5: bool) -> bytes:
    """PUBLISH in one join (the module deliveries' hot path)."""
    qos = packet.qos
    if qos not in (0, 1, 2):
        raise LocalProtocolError(f"QoS {qos}")
    topic = packet.topic.encode("utf-8")
    if len(topic) > _MAX_U16:
        raise LocalProtocolError(f"string of {len(topic)} bytes is too long for MQTT")
    parts = [_U16.pack(len(topic)), topic]
    if qos:
        if packet.packet_id is None:
            raise LocalProtocolError("QoS>0 PUBLISH needs a packet identifier")
        parts.append(_pid(packet.packet_id))
    if v5:
        parts.append(_properties(packet.properties))
    parts.append(packet.payload)
    body = b"".join(parts)
    return _fixed_header(0x30 | (packet.dup << 3) | (qos << 1) | int(packet.retain), len(body)) + body


def encode_qos1_publish(
    topic: str,
    payload: bytes,
    packet_id: int,
    *,
    dup: bool = False,
    v5: bool = False,
    names: BudgetDict[str, bytes] | None = None,
) -> bytes:
    """The bytes ``encode(Publish(topic, payload, 1, False, dup, packet_id), level)`` gives, without building the
    packet: a QoS 1 PUBLISH with no properties, how the hub delivers to modules (one per message). ``names``:
    the connection's cache of topics' wire bytes (topics recur: one per module input and bag)."""
    if not 0 < packet_id <= _MAX_U16:
        raise LocalProtocolError(f"packet identifier {packet_id} out of range")
    name = names.get(topic) if names is not None else None
    if name is None:
        raw = topic.encode("utf-8")
        if len(raw) > _MAX_U16:
            raise LocalProtocolError(f"string of {len(raw)} bytes is too long for MQTT")
        name = _U16.pack(len(raw)) + raw
        if names is not None:
            names.remember(topic, name, _ENTRY_OVERHEAD + 2 * len(raw))
    length = len(name) + (3 if v5 else 2) + len(payload)
    first = 0x3A if dup else 0x32
    if length < 0x80:  # _fixed_header in line for the lengths a delivery has
        header = bytes((first, length))
    elif length < 0x4000:
        header = bytes((first, (length & 0x7F) | 0x80, length >> 7))
    else:
        header = _fixed_header(first, length)
    return b"".join((header, name, _U16.pack(packet_id), b"\x00" if v5 else b"", payload))


def _encode_connect(c: Connect) -> bytes:
    v5 = c.protocol_level == MQTT_50
    flags = 0x02 if c.clean_start else 0
    payload = [_string(c.client_id)]
    if c.will is not None:
        flags |= 0x04 | (c.will.qos << 3) | (c.will.retain << 5)
        if v5:
            payload.append(_properties(c.will.properties))
        payload.append(_string(c.will.topic) + _binary(c.will.payload))
    if c.username is not None:
        flags |= 0x80
        payload.append(_string(c.username))
    if c.password is not None:
        flags |= 0x40
        payload.append(_binary(c.password))
    header = _string(c.protocol_name) + bytes([c.protocol_level, flags]) + struct.pack("!H", c.keepalive_s)
    if v5:
        header += _properties(c.properties)
    return _packet(0x10, header, *payload)
