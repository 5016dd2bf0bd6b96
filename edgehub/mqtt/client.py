"""The client's side of the codec, as the MQTT upstream speaks it: the packets a client writes, built by
``encoder``, and a server's bytes read by ``decoder`` (``from_server``) into what the client acts on. No I/O:
``edgehub.upstream.mqtt.connection`` drives it over an asyncio transport.

It covers what the upstream speaks and nothing more: CONNECT, PUBLISH (QoS 0 and 1, MQTT 5 properties), PUBACK,
SUBSCRIBE, PINGREQ and DISCONNECT out; CONNACK, PUBLISH (QoS 0 and 1), PUBACK, SUBACK, PINGRESP and (5.0)
DISCONNECT in. The hub subscribes at QoS 1 at most, never unsubscribes and never authenticates with AUTH, so a
QoS 2 PUBLISH, an UNSUBACK or an AUTH from the broker is a protocol violation.

Invariants:
* ``BrokerDecoder`` holds at most one packet's bytes: a fixed header announcing more than ``max_packet_bytes`` (the
  whole packet, as MQTT 5's Maximum Packet Size counts it) is refused before its body arrives;
* every refusal of the broker's bytes is a ``RemoteProtocolError`` whose ``reason_code`` says which (0x81 malformed,
  0x82 protocol error, 0x95 too large, or another MQTT 5 code the decoder names); once it raised, the decoder is
  not fed again (the connection is lost);
* what we encode is valid or ``LocalProtocolError`` (a string over 65,535 bytes, a packet id out of range): our bug.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from edgehub.core import LocalProtocolError
from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import encode, property_bytes
from edgehub.mqtt.packets import (
    MQTT_50,
    MQTT_311,
    NO_PROPERTIES,
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PropertyId,
    ProtocolViolation,
    PubAck,
    Publish,
    ReasonCode,
    SkippedPublish,
    SubAck,
    Subscribe,
    Subscription,
)

__all__ = [
    "MALFORMED",
    "PROTOCOL_ERROR",
    "TOO_LARGE",
    "BrokerDecoder",
    "BrokerPacket",
    "ConnAckIn",
    "DisconnectIn",
    "PacketIds",
    "PingRespIn",
    "PubAckIn",
    "PublishIn",
    "PublishProperties",
    "SkippedPublishIn",
    "SubAckIn",
    "connect_packet",
    "disconnect_packet",
    "pingreq_packet",
    "puback_packet",
    "publish_packet",
    "subscribe_packet",
]

MALFORMED: Final = int(ReasonCode.MALFORMED_PACKET)
PROTOCOL_ERROR: Final = int(ReasonCode.PROTOCOL_ERROR)
TOO_LARGE: Final = int(ReasonCode.PACKET_TOO_LARGE)

_PINGREQ: Final = encode(PingReq())
# 3.1.1's DISCONNECT, and 5.0's normal disconnection (reason 0 may be left out): the same two bytes.
_DISCONNECT: Final = encode(Disconnect())


@dataclass(frozen=True, slots=True)
class PublishProperties:
    """The MQTT 5 properties of one of our PUBLISHes: its content type and user properties, in the order given.
    ``packed`` is their encoding without the length prefix (what ``publish_wire_bytes`` counts)."""

    user: tuple[tuple[str, str], ...] = ()
    content_type: str | None = None
    properties: Properties = field(init=False, repr=False, compare=False)
    packed: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        values = {} if self.content_type is None else {PropertyId.CONTENT_TYPE: self.content_type}
        props = Properties(values, self.user)
        object.__setattr__(self, "properties", props)
        object.__setattr__(self, "packed", property_bytes(props))


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
    props = NO_PROPERTIES
    if v5:
        values: dict[PropertyId, int | str | bytes] = {}
        if session_expiry_s:
            values[PropertyId.SESSION_EXPIRY_INTERVAL] = session_expiry_s
        if max_packet_bytes is not None:
            values[PropertyId.MAXIMUM_PACKET_SIZE] = max_packet_bytes
        props = Properties(values)
    level = MQTT_50 if v5 else MQTT_311
    secret = None if password is None else password.encode()
    return encode(Connect(client_id, level, keepalive_s, clean, username, secret, None, props), level)


def publish_packet(
    topic: str, payload: bytes, *, qos: int, packet_id: int = 0, v5: bool, props: PublishProperties | None = None
) -> bytes:
    """PUBLISH at QoS 0 or 1 (``packet_id`` for QoS 1). Its length is ``mqtt.wire.publish_wire_bytes``'s."""
    properties = props.properties if props is not None and v5 else NO_PROPERTIES
    packet = Publish(topic, payload, qos, False, False, packet_id if qos else None, properties)
    return encode(packet, MQTT_50 if v5 else MQTT_311)


def puback_packet(packet_id: int) -> bytes:
    """PUBACK, success (MQTT 5 lets the reason code 0 be left out: the same bytes on both versions)."""
    return encode(PubAck(packet_id))


def subscribe_packet(packet_id: int, filters: Sequence[tuple[str, int]], *, v5: bool) -> bytes:
    """SUBSCRIBE to ``filters`` (each with its maximum QoS; MQTT 5's other options at their defaults)."""
    if not filters:
        raise LocalProtocolError("SUBSCRIBE needs at least one filter")
    subscriptions = tuple(Subscription(topic_filter, qos) for topic_filter, qos in filters)
    return encode(Subscribe(packet_id, subscriptions), MQTT_50 if v5 else MQTT_311)


def pingreq_packet() -> bytes:
    return _PINGREQ


def disconnect_packet() -> bytes:
    return _DISCONNECT


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
class SkippedPublishIn:
    """A PUBLISH over our Maximum Packet Size: its payload was skipped unread; acknowledge it and say so."""

    topic: str
    qos: int
    packet_id: int  # 0 for QoS 0
    size_bytes: int


@dataclass(frozen=True, slots=True)
class PingRespIn:
    pass


@dataclass(frozen=True, slots=True)
class DisconnectIn:
    code: int
    reason: str | None = None


BrokerPacket = ConnAckIn | PubAckIn | SubAckIn | PublishIn | SkippedPublishIn | PingRespIn | DisconnectIn
_PINGRESP: Final = PingRespIn()


def _optional_positive(props: Properties, pid: PropertyId, name: str) -> int | None:
    """An integer property that may be left out but is never 0 (MQTT 5, 3.2.2.3.3 and 3.2.2.3.6)."""
    value = props.get_int(pid)
    if value == 0:
        raise ProtocolViolation(f"CONNACK: {name} of 0")
    return value


class BrokerDecoder:
    """Bytes from the broker in (``feed``), the complete packets among them out; keeps a partial packet."""

    def __init__(self, *, v5: bool, max_packet_bytes: int) -> None:
        self.v5 = v5
        self.max_packet_bytes = max_packet_bytes
        level = MQTT_50 if v5 else MQTT_311
        # A broker may send a PUBLISH over our limit (3.1.1 cannot be told one): skipped, so it can be acked and
        # dropped; a broker that keeps the session would otherwise send it again on every connection.
        self._decoder = Decoder(
            protocol_level=level,
            max_packet_size=max_packet_bytes,
            from_server=True,
            max_qos=1,
            skip_oversize_publish=True,
        )

    def feed(self, data: bytes) -> list[BrokerPacket]:
        """The packets ``data`` completes, in order; raises ``RemoteProtocolError`` on bytes that are not one."""
        return [self._received(packet) for packet in self._decoder.receive_data(data)]

    def _received(self, packet: Packet) -> BrokerPacket:
        """What the client acts on in ``packet``; a packet this client never asks for is a protocol violation."""
        if isinstance(packet, PubAck):
            return PubAckIn(packet.packet_id, packet.reason_code, packet.properties.get_str(PropertyId.REASON_STRING))
        if isinstance(packet, Publish):
            return _publish(packet)
        if isinstance(packet, SkippedPublish):
            return SkippedPublishIn(packet.topic, packet.qos, packet.packet_id or 0, packet.size_bytes)
        if isinstance(packet, ConnAck):
            return self._connack(packet)
        if isinstance(packet, SubAck):
            if not packet.reason_codes:
                raise MalformedPacket("SUBACK: no return codes")
            return SubAckIn(packet.packet_id, bytes(packet.reason_codes))
        if isinstance(packet, PingResp):
            return _PINGRESP
        if isinstance(packet, Disconnect) and self.v5:  # 3.1.1 has no server DISCONNECT
            return DisconnectIn(packet.reason_code, packet.properties.get_str(PropertyId.REASON_STRING))
        name = type(packet).__name__.upper()
        raise ProtocolViolation(f"{name}: not expected by this client")

    def _connack(self, ack: ConnAck) -> ConnAckIn:
        props = ack.properties
        return ConnAckIn(
            ack.session_present,
            ack.reason_code,
            props.get_int(PropertyId.SERVER_KEEP_ALIVE),
            props.get_str(PropertyId.REASON_STRING),
            _optional_positive(props, PropertyId.RECEIVE_MAXIMUM, "Receive Maximum"),
            _optional_positive(props, PropertyId.MAXIMUM_PACKET_SIZE, "Maximum Packet Size"),
        )


def _publish(packet: Publish) -> PublishIn:
    if packet.qos == 2:  # the decoder refuses it before reading it, but not on a topic its fast path knows
        raise ProtocolViolation("PUBLISH: QoS 2, above every subscription of ours")
    if not packet.topic:
        raise ProtocolViolation("PUBLISH: an empty topic (we allow no topic aliases)")
    props = packet.properties
    return PublishIn(
        packet.topic,
        packet.payload,
        packet.qos,
        packet.packet_id or 0,
        props.user,
        props.get_str(PropertyId.CONTENT_TYPE),
        props.get_bytes(PropertyId.CORRELATION_DATA),
    )
