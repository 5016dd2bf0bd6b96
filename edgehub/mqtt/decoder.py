"""MQTT 3.1.1 and 5.0 decoding: bytes in, packets out. No I/O; the only state is the bytes of an incomplete
packet, the protocol level and the connection's topic cache.

``Decoder.receive_data(data)`` returns every complete packet in the bytes received so far, in order, so that
all PUBLISHes of one socket read reach the hub as one group.

Invariants:
* The decoder raises only ``MalformedPacket`` (0x81), ``PacketTooLarge`` (0x95) and ``ProtocolViolation``
  (0x82), all ``RemoteProtocolError``s carrying the MQTT 5 reason code. After it has raised, the decoder is
  dead (every further call raises again): a broken stream cannot be resynchronised.
* The protocol version is learned from CONNECT (server side) or given up front (client side); before it is
  known, only CONNECT can be decoded.
* A client's decoder (``from_server=True``) refuses, before reading its body, a packet type only clients send
  (CONNECT, SUBSCRIBE, UNSUBSCRIBE, PINGREQ). The server's decoder reads every type and leaves it to the
  connection's state machine to say which it takes when.
* A PUBLISH on a topic this decoder has decoded before may be read by ``fastpaths.publish_fast``; it gives the
  packet the general reader gives, or leaves the packet to it (tests/mqtt/test_fastpaths.py).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final

from edgehub.core import RemoteProtocolError
from edgehub.mqtt.caches import TOPIC_CACHE_BYTES, BudgetDict, topic_cost
from edgehub.mqtt.fastpaths import publish_fast
from edgehub.mqtt.packets import (
    MAX_VARINT,
    MQTT_50,
    MQTT_311,
    NO_PROPERTIES,
    PROPERTY_KIND,
    SENT_BY_SERVER,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    Packet,
    PacketTooLarge,
    PacketType,
    PingReq,
    PingResp,
    Properties,
    PropertyId,
    PropertyValue,
    ProtocolViolation,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SkippedPublish,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)

__all__ = ["Decoder", "decode_varint"]

_PUBLISH: Final = int(PacketType.PUBLISH)
_ID_ACKS: Final[Mapping[int, type[PubAck | PubRec | PubRel | PubComp]]] = {
    PacketType.PUBACK: PubAck,
    PacketType.PUBREC: PubRec,
    PacketType.PUBREL: PubRel,
    PacketType.PUBCOMP: PubComp,
}  # read for every packet: a plain int, not an Enum member look-up


def decode_varint(
    data: bytes | bytearray | memoryview, pos: int, what: str = "variable byte integer"
) -> tuple[int, int] | None:
    """``(value, next_pos)``, or None when the bytes end before the integer does. Raises MalformedPacket
    for a fifth continuation byte (naming ``what`` the integer is)."""
    value = 0
    for i in range(4):
        if pos + i >= len(data):
            return None
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos + i + 1
    raise MalformedPacket(f"{what} over four bytes")


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
            raise MalformedPacket("packet ends early, inside a field")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        if self.pos >= self.end:
            raise MalformedPacket("packet ends early, inside a field")
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
            raise MalformedPacket("packet ends early, inside a variable byte integer")
        value, self.pos = got
        return value

    def binary(self) -> bytes:
        return self.take(self.u16())

    def string(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedPacket("a string that is not UTF-8") from exc
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
            kind = PROPERTY_KIND.get(raw_id)
            if kind is None:
                raise MalformedPacket(f"unknown property 0x{raw_id:02x}")
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

    def reason_tail(self) -> tuple[int, Properties]:
        """MQTT 5's optional end of an ack, DISCONNECT or AUTH: a reason code, then properties (0 and none when
        left out)."""
        rc = 0
        props = NO_PROPERTIES
        if self.remaining():
            rc = self.u8()
            if self.remaining():
                props = self.properties()
        return rc, props

    def done(self, what: str) -> None:
        if self.pos != self.end:
            raise MalformedPacket(f"{what}: {self.end - self.pos} bytes after the packet's fields")


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


class Decoder:
    """Splits a byte stream into packets. Feed it with ``receive_data``; it returns complete packets.

    ``max_packet_size`` bounds a whole packet (fixed header included), as MQTT 5's Maximum Packet Size does;
    a larger announced length raises ``PacketTooLarge`` before the body is buffered. ``from_server``: this is a
    client's decoder, reading what a server sends (give ``protocol_level`` too: a client knows it up front).
    ``max_qos``: a PUBLISH above it is a protocol error found before its fields are read (a client that
    subscribed at QoS 1 at most). The fast path does not look: a caller that sets it checks what it gets too.
    ``skip_oversize_publish``: a PUBLISH over ``max_packet_size`` is not an error but a ``SkippedPublish`` (its
    topic and packet id, read from the packet's first bytes), and the rest of it is dropped as it arrives, never
    buffered: a client whose server can send what it cannot take (MQTT 3.1.1 has no Maximum Packet Size) acks it
    and goes on. Any other packet over the limit still raises ``PacketTooLarge``.
    """

    def __init__(
        self,
        *,
        protocol_level: int | None = None,
        max_packet_size: int = MAX_VARINT + 5,
        topic_cache_bytes: int = TOPIC_CACHE_BYTES,
        from_server: bool = False,
        max_qos: int = 2,
        skip_oversize_publish: bool = False,
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
        self._seen_connect = False
        self._from_server = from_server
        self._max_qos = max_qos
        self._skip_oversize_publish = skip_oversize_publish
        self._skip_bytes = 0  # what is left of a skipped PUBLISH, dropped as it arrives

    def at_packet_boundary(self) -> bool:
        """Nothing of a packet is buffered, the decoder is alive and knows its protocol level: the next bytes
        start a packet (``fastpaths.plain_puback_ids`` may read them)."""
        return not self._buf and self._error is None and self.protocol_level is not None

    def buffered_bytes(self) -> int:
        """The bytes of a packet not yet complete that the decoder holds until its next read."""
        return len(self._buf)

    def discard_partial(self) -> None:
        """Forget the bytes of a packet not yet complete: the connection takes no more reads (they may be most of
        a 256 KB CONNECT, held otherwise until the decoder is freed)."""
        self._buf = bytearray()

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Every complete packet so far, in order. Partial bytes stay buffered for the next call."""
        if self._error is not None:
            raise self._error
        if self._skip_bytes:
            dropped = min(self._skip_bytes, len(data))
            self._skip_bytes -= dropped
            data = data[dropped:]
            if not data:
                return []
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
        v5 = self.protocol_level == MQTT_50
        try:
            while n - pos >= 2:
                length = buf[pos + 1]
                if length < 0x80:  # a one-byte remaining length: every packet under 128 bytes
                    body = pos + 2
                elif n - pos >= 3 and buf[pos + 2] < 0x80:  # two bytes: under 16 KiB (a 200-byte telemetry PUBLISH)
                    length = (length & 0x7F) | (buf[pos + 2] << 7)
                    body = pos + 3
                else:
                    got = decode_varint(buf, pos + 1, "remaining length")
                    if got is None:
                        break
                    length, body = got
                end = body + length
                first = buf[pos]
                if end - pos > self.max_packet_size:
                    if not (self._skip_oversize_publish and first >> 4 == _PUBLISH and known):
                        raise PacketTooLarge(f"packet of {end - pos} bytes is over the limit of {self.max_packet_size}")
                    skipped = self._skipped_publish(first, buf, pos, body, end)
                    if skipped is None:
                        break  # its topic and packet id are not all here yet (at most 64 KiB of it is kept)
                    packets.append(skipped)
                    if end > n:
                        self._skip_bytes = end - n
                    pos = min(end, n)
                    continue
                if n < end:
                    break
                if first >> 4 == _PUBLISH and known:
                    publish = publish_fast(self._topics, v5, first, buf, body, end)
                    packets.append(publish if publish is not None else self._publish_general(first, buf, body, end))
                elif first == 0x40 and length == 2 and known and (buf[body] or buf[body + 1]):
                    packets.append(PubAck((buf[body] << 8) | buf[body + 1]))  # a PUBACK with a packet id only
                else:  # (id 0 too: the general path refuses it)
                    packets.append(self._decode(first, bytes(buf[body:end])))
                    known = self.protocol_level is not None
                    v5 = self.protocol_level == MQTT_50
                pos = end
        except RemoteProtocolError as exc:
            self._error = exc
            raise
        if buf is self._buf:
            del self._buf[:pos]
        elif pos < n:
            self._buf += buf[pos:]
        return packets

    def _skipped_publish(
        self, first: int, buf: bytes | bytearray, pos: int, body: int, end: int
    ) -> SkippedPublish | None:
        """The topic and packet id of an oversize PUBLISH from its first bytes; None until they are all here."""
        qos = (first >> 1) & 0x03
        if qos == 3:
            raise MalformedPacket("PUBLISH with QoS 3")
        if qos > self._max_qos:
            raise ProtocolViolation(f"PUBLISH: QoS {qos}, above every subscription of ours")
        if len(buf) < body + 2:
            return None
        topic_end = body + 2 + ((buf[body] << 8) | buf[body + 1])
        head_end = topic_end + (2 if qos else 0)
        if head_end > end:
            raise MalformedPacket("PUBLISH: its topic runs past the packet's end")
        if len(buf) < head_end:
            return None
        packet_id = None
        if qos:
            packet_id = (buf[topic_end] << 8) | buf[topic_end + 1]
            if packet_id == 0:
                raise ProtocolViolation("packet identifier 0")
        topic = bytes(buf[body + 2 : topic_end]).decode("utf-8", "replace")
        return SkippedPublish(topic, qos, packet_id, end - pos)

    def _publish_general(self, first: int, buf: bytes | bytearray, body: int, end: int) -> Publish:
        packet = self._decode(first, bytes(buf[body:end]))
        assert isinstance(packet, Publish)
        # The topic is valid (it decoded): remember it, so that the next PUBLISH on it takes the fast path.
        raw = packet.topic.encode()
        self._topics.remember(raw, packet.topic, topic_cost(len(raw)))
        return packet

    def _decode(self, first: int, body: bytes) -> Packet:
        ptype, flags = first >> 4, first & 0x0F
        if ptype == 0:
            raise MalformedPacket("packet type 0 is reserved")
        if self._from_server and ptype not in SENT_BY_SERVER:
            raise MalformedPacket(f"packet type {ptype} ({PacketType(ptype).name}) is not one a server sends")
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
        elif ptype in _ID_ACKS:
            pid = r.packet_id()
            rc, props = r.reason_tail() if v5 else (0, NO_PROPERTIES)
            packet = _ID_ACKS[ptype](pid, rc, props)
        elif ptype in (PacketType.SUBSCRIBE, PacketType.SUBACK, PacketType.UNSUBSCRIBE, PacketType.UNSUBACK):
            packet = self._subscription(ptype, r, v5)
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
            packet = Disconnect(*r.reason_tail()) if v5 else Disconnect()
        else:  # AUTH
            if not v5:
                raise MalformedPacket("AUTH is an MQTT 5 packet")
            packet = Auth(*r.reason_tail())
        r.done(type(packet).__name__.upper())
        return packet

    def _subscription(self, ptype: int, r: _Reader, v5: bool) -> Subscribe | SubAck | Unsubscribe | UnsubAck:
        """SUBSCRIBE, SUBACK, UNSUBSCRIBE or UNSUBACK: a packet id and (MQTT 5) properties, then its list."""
        pid = r.packet_id()
        props = r.properties() if v5 else NO_PROPERTIES
        if ptype == PacketType.SUBSCRIBE:
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
            return Subscribe(pid, tuple(subs), props)
        elif ptype == PacketType.SUBACK:
            return SubAck(pid, tuple(r.take(r.remaining())), props)
        elif ptype == PacketType.UNSUBSCRIBE:
            filters: list[str] = []
            while r.remaining():
                filters.append(r.string())
            if not filters:
                raise ProtocolViolation("UNSUBSCRIBE without a topic filter")
            return Unsubscribe(pid, tuple(filters), props)
        else:  # UNSUBACK
            return UnsubAck(pid, tuple(r.take(r.remaining())) if v5 else (), props)

    def _publish(self, flags: int, r: _Reader, v5: bool) -> Publish:
        qos = (flags >> 1) & 0x03
        if qos == 3:
            raise MalformedPacket("PUBLISH with QoS 3")
        if qos > self._max_qos:
            raise ProtocolViolation(f"PUBLISH: QoS {qos}, above every subscription of ours")
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
        if self._seen_connect:
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
