"""MQTT 3.1.1 and 5.0 packet values, their codes and the codec's errors: what ``decoder`` makes of bytes and
``encoder`` makes bytes of. No behaviour beyond reading properties.

Invariants:
* Every packet (and ``Properties``, ``Will``, ``Subscription``) is a frozen ``msgspec.Struct`` with ``gc=False``:
  one family, immutable, compared by value, and cheap to build (a PUBLISH and its PUBACK are built for every
  message). Nothing in them refers back to a packet, so they form no reference cycles.
* ``Properties`` is empty for MQTT 3.1.1; ``NO_PROPERTIES`` is the one empty instance the fast paths test by
  identity.

Errors::

    RemoteProtocolError (edgehub.core)
    ├── MalformedPacket      bytes that are not MQTT (reason 0x81)
    ├── ProtocolViolation    well-formed but forbidden (reason 0x82)
    └── PacketTooLarge       over the maximum packet size (reason 0x95)
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Final

import msgspec

from edgehub.core import RemoteProtocolError
from edgehub.mqtt.varint import MAX_VARINT

__all__ = [
    "MAX_VARINT",
    "MQTT_50",
    "MQTT_311",
    "NO_PROPERTIES",
    "PROPERTY_KIND",
    "SENT_BY_SERVER",
    "Auth",
    "ConnAck",
    "Connect",
    "Disconnect",
    "MalformedPacket",
    "Packet",
    "PacketTooLarge",
    "PacketType",
    "PingReq",
    "PingResp",
    "Properties",
    "PropertyId",
    "PropertyValue",
    "ProtocolViolation",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "ReasonCode",
    "SkippedPublish",
    "SubAck",
    "Subscribe",
    "Subscription",
    "UnsubAck",
    "Unsubscribe",
    "Will",
]

MQTT_311: Final = 4
MQTT_50: Final = 5


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


# The packet types a server sends a client; the others (CONNECT, SUBSCRIBE, UNSUBSCRIBE, PINGREQ) only a client
# sends. PUBLISH, its acks, DISCONNECT and AUTH go both ways.
SENT_BY_SERVER: Final = frozenset(
    {
        PacketType.CONNACK,
        PacketType.PUBLISH,
        PacketType.PUBACK,
        PacketType.PUBREC,
        PacketType.PUBREL,
        PacketType.PUBCOMP,
        PacketType.SUBACK,
        PacketType.UNSUBACK,
        PacketType.PINGRESP,
        PacketType.DISCONNECT,
        PacketType.AUTH,
    }
)


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
PROPERTY_KIND: Final[Mapping[int, str]] = {
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


class Will(msgspec.Struct, frozen=True, gc=False):
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


class Connect(msgspec.Struct, frozen=True, gc=False):
    client_id: str
    protocol_level: int = MQTT_311
    keepalive_s: int = 60
    clean_start: bool = True
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES
    protocol_name: str = "MQTT"


class ConnAck(msgspec.Struct, frozen=True, gc=False):
    reason_code: int = 0
    session_present: bool = False
    properties: Properties = NO_PROPERTIES


class Publish(msgspec.Struct, frozen=True, gc=False):
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES


class _IdAck(msgspec.Struct, frozen=True, gc=False):
    """What PUBACK, PUBREC, PUBREL and PUBCOMP carry: a packet id, then (MQTT 5) a reason code and properties."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


class PubAck(_IdAck, frozen=True, gc=False):
    """The answer to a QoS 1 PUBLISH."""


class PubRec(_IdAck, frozen=True, gc=False):
    """The first answer to a QoS 2 PUBLISH."""


class PubRel(_IdAck, frozen=True, gc=False):
    """The sender's release of a QoS 2 message, after PUBREC."""


class PubComp(_IdAck, frozen=True, gc=False):
    """The last answer of a QoS 2 exchange, to PUBREL."""


class Subscription(msgspec.Struct, frozen=True, gc=False):
    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


class Subscribe(msgspec.Struct, frozen=True, gc=False):
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES


class SubAck(msgspec.Struct, frozen=True, gc=False):
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = NO_PROPERTIES


class Unsubscribe(msgspec.Struct, frozen=True, gc=False):
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


class UnsubAck(msgspec.Struct, frozen=True, gc=False):
    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = NO_PROPERTIES


class PingReq(msgspec.Struct, frozen=True, gc=False):
    pass


class PingResp(msgspec.Struct, frozen=True, gc=False):
    pass


class _Reasoned(msgspec.Struct, frozen=True, gc=False):
    """What DISCONNECT and AUTH carry: (MQTT 5) a reason code and properties."""

    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


class Disconnect(_Reasoned, frozen=True, gc=False):
    """The end of a connection, said by either side (by the server in MQTT 5 only)."""


class Auth(_Reasoned, frozen=True, gc=False):
    """MQTT 5 enhanced authentication (not offered by this head: a client's AUTH is a protocol error)."""


class SkippedPublish(msgspec.Struct, frozen=True, gc=False):
    """No packet on the wire: what a client's decoder (``Decoder(skip_oversize_publish=True)``) yields in place of
    a PUBLISH over its maximum packet size. It read the topic and packet id and skipped the rest unbuffered, so the
    client can acknowledge it (a server that keeps a session then stops sending it) and say what it dropped; an
    MQTT 3.1.1 server cannot be told a Maximum Packet Size."""

    topic: str
    qos: int
    packet_id: int | None
    size_bytes: int


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
    | SkippedPublish
)
