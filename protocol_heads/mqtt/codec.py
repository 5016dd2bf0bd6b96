"""Sans-IO MQTT 3.1.1 and 5.0 codec, one import for its users: bytes in, packets out; packets in, bytes out.

It holds no code: the packet values live in ``packets``, decoding in ``decoder``, encoding in ``encoder``, and the
per-message shortcuts in ``fastpaths`` (pinned to the general path by tests/protocol_heads/mqtt/test_fastpaths.py).
``Decoder.receive_data(data)`` returns every complete packet in the bytes received so far, in order;
``encode(packet, version)`` returns wire bytes. The decoder raises only ``RemoteProtocolError``s (the peer broke
the protocol), ``encode`` only ``LocalProtocolError`` (a value that cannot be put on the wire).
"""

from __future__ import annotations

from protocol_heads.mqtt.caches import TOPIC_CACHE_BYTES
from protocol_heads.mqtt.decoder import Decoder, decode_varint
from protocol_heads.mqtt.encoder import encode, encode_varint
from protocol_heads.mqtt.fastpaths import encode_qos1_publish
from protocol_heads.mqtt.packets import (
    MAX_VARINT,
    MQTT_50,
    MQTT_311,
    NO_PROPERTIES,
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
    ProtocolViolation,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)

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
