"""Byte-exact codec tests (packet builders after paho's test suite) and a Hypothesis fuzz of the decoder."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgehub.core import LocalProtocolError, RemoteProtocolError
from edgehub.mqtt.decoder import Decoder, decode_varint
from edgehub.mqtt.encoder import encode, encode_varint
from edgehub.mqtt.packets import (
    MQTT_50,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    Packet,
    PacketTooLarge,
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

# --- packet builders, written independently of the codec (as paho's tests do) -------------------------------


def s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!H", len(raw)) + raw


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + encode_varint(len(body)) + body


def connect_v3(client_id: str, keepalive: int = 60, *, username: str | None = None, password: bytes = b"") -> bytes:
    flags = 0x02 | (0xC0 if username is not None else 0)
    body = s("MQTT") + bytes([4, flags]) + struct.pack("!H", keepalive) + s(client_id)
    if username is not None:
        body += s(username) + struct.pack("!H", len(password)) + password
    return packet(0x10, body)


def connect_v5(client_id: str, keepalive: int = 60, props: bytes = b"\x00") -> bytes:
    return packet(0x10, s("MQTT") + bytes([5, 0x02]) + struct.pack("!H", keepalive) + props + s(client_id))


def decoded(data: bytes, level: int | None = None) -> list[Packet]:
    return Decoder(protocol_level=level).receive_data(data)


# --- variable byte integers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ],
)
def test_varint_matches_the_spec_table_both_ways(value: int, wire: bytes) -> None:
    assert encode_varint(value) == wire
    assert decode_varint(wire, 0) == (value, len(wire))


def test_varint_with_five_bytes_is_malformed() -> None:
    with pytest.raises(MalformedPacket):
        decode_varint(b"\xff\xff\xff\xff\x01", 0)


def test_varint_over_the_maximum_cannot_be_encoded() -> None:
    with pytest.raises(LocalProtocolError):
        encode_varint(268_435_456)


# --- byte-exact packets ----------------------------------------------------------------------------------------


def test_connect_v311_encodes_byte_for_byte() -> None:
    wire = bytes.fromhex("101000044d5154540402003c000474657374")
    assert encode(Connect("test")) == wire
    assert decoded(wire) == [Connect("test")]


def test_connect_with_username_and_password_round_trips() -> None:
    wire = connect_v3("dev1", 30, username="hub/dev1/?api-version=2021-04-12", password=b"SharedAccessSignature x")
    [got] = decoded(wire)
    assert got == Connect(
        "dev1", keepalive_s=30, username="hub/dev1/?api-version=2021-04-12", password=b"SharedAccessSignature x"
    )
    assert encode(got) == wire


def test_connect_v5_with_session_expiry_and_will_round_trips() -> None:
    c = Connect(
        "m",
        protocol_level=MQTT_50,
        keepalive_s=10,
        clean_start=False,
        will=Will("w/t", b"gone", 1, True, Properties({PropertyId.WILL_DELAY_INTERVAL: 5})),
        properties=Properties({PropertyId.SESSION_EXPIRY_INTERVAL: 3600}, (("a", "b"),)),
    )
    wire = encode(c)
    assert wire[2:12] == s("MQTT") + bytes([5, 0x2C, 0, 10])
    assert decoded(wire) == [c]


def test_connack_v311_and_v5_are_byte_exact() -> None:
    assert encode(ConnAck(0, False)) == b"\x20\x02\x00\x00"
    assert encode(ConnAck(0, True, Properties()), MQTT_50) == b"\x20\x03\x01\x00\x00"
    props = Properties({PropertyId.RECEIVE_MAXIMUM: 16, PropertyId.MAXIMUM_QOS: 1})
    assert encode(ConnAck(0, False, props), MQTT_50) == b"\x20\x08\x00\x00\x05\x21\x00\x10\x24\x01"


def test_publish_qos1_is_byte_exact() -> None:
    wire = b"\x32\x09" + s("a/b") + b"\x00\x01hi"
    assert encode(Publish("a/b", b"hi", 1, packet_id=1)) == wire
    assert decoded(wire, 4) == [Publish("a/b", b"hi", 1, packet_id=1)]


def test_publish_v5_with_properties_round_trips() -> None:
    props = Properties(
        {
            PropertyId.CONTENT_TYPE: "application/json",
            PropertyId.CORRELATION_DATA: b"\x01\x02",
            PropertyId.MESSAGE_EXPIRY_INTERVAL: 60,
        },
        (("k", "v"), ("k", "w")),
    )
    p = Publish("devices/d/messages/events/", b"{}", 1, False, True, 7, props)
    wire = encode(p, MQTT_50)
    assert wire[0] == 0x3A  # DUP | QoS1
    assert decoded(wire, MQTT_50) == [p]


def test_publish_v5_qos0_without_properties_is_byte_exact() -> None:
    assert encode(Publish("t", b"x"), MQTT_50) == b"\x30\x05\x00\x01t\x00x"


@pytest.mark.parametrize(
    ("ack", "v3", "v5"),
    [
        (PubAck(1), b"\x40\x02\x00\x01", b"\x40\x02\x00\x01"),
        (PubAck(1, ReasonCode.QUOTA_EXCEEDED), b"\x40\x02\x00\x01", b"\x40\x03\x00\x01\x97"),
        (PubRec(2), b"\x50\x02\x00\x02", b"\x50\x02\x00\x02"),
        (PubRel(3), b"\x62\x02\x00\x03", b"\x62\x02\x00\x03"),
        (PubComp(4), b"\x70\x02\x00\x04", b"\x70\x02\x00\x04"),
        (PubComp(4, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND), b"\x70\x02\x00\x04", b"\x70\x03\x00\x04\x92"),
    ],
)
def test_acks_are_byte_exact_in_both_versions(ack: Packet, v3: bytes, v5: bytes) -> None:
    assert encode(ack, 4) == v3
    assert encode(ack, MQTT_50) == v5
    assert decoded(v5, MQTT_50) == [ack]


def test_subscribe_and_suback_are_byte_exact() -> None:
    wire = b"\x82\x08\x00\x05" + s("a/#") + b"\x01"
    assert decoded(wire, 4) == [Subscribe(5, (Subscription("a/#", 1),))]
    assert encode(Subscribe(5, (Subscription("a/#", 1),))) == wire
    assert encode(SubAck(5, (1, 0x80))) == b"\x90\x04\x00\x05\x01\x80"
    assert encode(SubAck(5, (1,)), MQTT_50) == b"\x90\x04\x00\x05\x00\x01"


def test_subscribe_v5_options_round_trip() -> None:
    sub = Subscribe(9, (Subscription("x/+", 1, True, True, 2),), Properties({PropertyId.SUBSCRIPTION_IDENTIFIER: 300}))
    assert decoded(encode(sub, MQTT_50), MQTT_50) == [sub]


def test_unsubscribe_and_unsuback_are_byte_exact() -> None:
    wire = b"\xa2\x05\x00\x06" + s("a")
    assert decoded(wire, 4) == [Unsubscribe(6, ("a",))]
    assert encode(UnsubAck(6)) == b"\xb0\x02\x00\x06"
    assert encode(UnsubAck(6, (0x11,)), MQTT_50) == b"\xb0\x04\x00\x06\x00\x11"


def test_ping_disconnect_and_auth_are_byte_exact() -> None:
    assert encode(PingReq()) == b"\xc0\x00"
    assert encode(PingResp()) == b"\xd0\x00"
    assert encode(Disconnect()) == b"\xe0\x00"
    assert encode(Disconnect(ReasonCode.PACKET_TOO_LARGE), MQTT_50) == b"\xe0\x01\x95"
    assert decoded(b"\xe0\x01\x8e", MQTT_50) == [Disconnect(ReasonCode.SESSION_TAKEN_OVER)]
    auth = Auth(ReasonCode.CONTINUE_AUTHENTICATION, Properties({PropertyId.AUTHENTICATION_METHOD: "SAS"}))
    assert decoded(encode(auth, MQTT_50), MQTT_50) == [auth]


def test_every_complete_packet_of_one_read_comes_out_together_and_partials_wait() -> None:
    d = Decoder()
    stream = connect_v3("c") + encode(Publish("t", b"1", 1, packet_id=1)) + encode(Publish("t", b"2", 1, packet_id=2))
    tail = encode(PingReq())
    got = d.receive_data(stream + tail[:1])
    assert [type(p) for p in got] == [Connect, Publish, Publish]
    assert d.receive_data(b"") == []
    assert d.receive_data(tail[1:]) == [PingReq()]


def test_byte_at_a_time_feeding_yields_the_same_packets() -> None:
    stream = connect_v5("c") + encode(Publish("t", b"x" * 300, 1, packet_id=3), MQTT_50)
    d = Decoder()
    got: list[Packet] = []
    for i in range(len(stream)):
        got += d.receive_data(stream[i : i + 1])
    assert got == Decoder().receive_data(stream)


def test_packet_over_the_maximum_size_is_refused_before_its_body_arrives() -> None:
    d = Decoder(protocol_level=MQTT_50, max_packet_size=100)
    header = b"\x30" + encode_varint(200)
    with pytest.raises(PacketTooLarge) as info:
        d.receive_data(header)
    assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE
    with pytest.raises(PacketTooLarge):
        d.receive_data(b"more")


def test_publish_before_connect_is_a_protocol_violation() -> None:
    with pytest.raises(ProtocolViolation):
        decoded(encode(Publish("t")))


def test_unknown_protocol_level_is_refused_with_unsupported_version() -> None:
    wire = packet(0x10, s("MQTT") + bytes([3, 2, 0, 60]) + s("c"))
    with pytest.raises(ProtocolViolation) as info:
        decoded(wire)
    assert info.value.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION


@pytest.mark.parametrize(
    "wire",
    [
        b"\x36\x05\x00\x01t\x00\x01",  # QoS 3
        b"\x38\x04\x00\x01tx",  # DUP on QoS 0
        b"\x63\x02\x00\x01",  # PUBREL with wrong flags
        b"\x30\x03\x00\x05t",  # topic length past the end
        b"\x30\x05\x00\x02\xff\xfe\x00",  # topic not UTF-8
        b"\x00\x00",  # reserved type 0
        b"\xc0\x01\x00",  # PINGREQ with a body
        b"\x82\x02\x00\x01",  # SUBSCRIBE without filters
    ],
)
def test_malformed_packets_raise_remote_protocol_errors_with_a_reason_code(wire: bytes) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decoded(wire, 4)
    assert info.value.reason_code in (ReasonCode.MALFORMED_PACKET, ReasonCode.PROTOCOL_ERROR)


def test_wildcard_in_a_publish_topic_is_topic_name_invalid() -> None:
    with pytest.raises(ProtocolViolation) as info:
        decoded(encode(Publish("a/+")), 4)
    assert info.value.reason_code == ReasonCode.TOPIC_NAME_INVALID


def test_duplicate_property_is_a_protocol_error() -> None:
    props = bytes([10]) + b"\x02\x00\x00\x00\x01" + b"\x02\x00\x00\x00\x01"
    wire = packet(0x30, s("t") + props)
    with pytest.raises(ProtocolViolation):
        decoded(wire, MQTT_50)


def test_unencodable_values_raise_local_protocol_error() -> None:
    with pytest.raises(LocalProtocolError):
        encode(Publish("t", qos=1))  # no packet id
    with pytest.raises(LocalProtocolError):
        encode(Publish("x" * 70_000))
    with pytest.raises(LocalProtocolError):
        encode(Auth())


# --- fuzz --------------------------------------------------------------------------------------------------------

ALLOWED = (MalformedPacket, ProtocolViolation, PacketTooLarge)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([None, 4, 5]))
def test_decoder_fuzz_raises_only_its_declared_errors(data: bytes, level: int | None) -> None:
    d = Decoder(protocol_level=level, max_packet_size=256)
    try:
        d.receive_data(data)
    except ALLOWED:
        pass


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_decoder_fuzz_on_mutated_valid_packets_raises_only_declared_errors(data: st.DataObject) -> None:
    valid = [
        connect_v5("c", props=b"\x05\x11\x00\x00\x0e\x10"),
        encode(Publish("a/b", b"hi", 1, packet_id=1, properties=Properties(user=(("k", "v"),))), MQTT_50),
        encode(Subscribe(5, (Subscription("a/#", 1),)), MQTT_50),
        encode(PubAck(1, 0x97), MQTT_50),
        encode(Disconnect(0x95), MQTT_50),
    ]
    wire = bytearray(data.draw(st.sampled_from(valid)))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    level = 5 if wire[:1] != b"\x10" else None
    try:
        Decoder(protocol_level=level).receive_data(bytes(wire))
    except ALLOWED:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.text(min_size=1, max_size=40).filter(lambda t: "+" not in t and "#" not in t and "\x00" not in t),
    st.binary(max_size=200),
    st.integers(0, 2),
    st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)).filter(lambda p: "\x00" not in p[0] + p[1])),
)
def test_publish_round_trips_through_encode_and_decode(
    topic: str, payload: bytes, qos: int, user: list[tuple[str, str]]
) -> None:
    p = Publish(topic, payload, qos, packet_id=1 if qos else None, properties=Properties(user=tuple(user)))
    assert Decoder(protocol_level=MQTT_50).receive_data(encode(p, MQTT_50)) == [p]
