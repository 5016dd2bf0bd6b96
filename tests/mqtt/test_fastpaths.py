"""The codec's fast paths (``fastpaths``) pinned to the general path: each gives what the general decoder or
``encode`` gives, or leaves the work to it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgehub.core import LocalProtocolError
from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import UnencodableField, encode
from edgehub.mqtt.fastpaths import encode_qos1_publish, plain_puback_ids, puback_success
from edgehub.mqtt.packets import (
    MQTT_50,
    MQTT_311,
    MalformedPacket,
    Packet,
    PacketTooLarge,
    Properties,
    PropertyId,
    ProtocolViolation,
    PubAck,
    Publish,
)

ALLOWED = (MalformedPacket, ProtocolViolation, PacketTooLarge)

# --- plain_puback_ids: a read of nothing but PUBACKs -----------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(1, 0xFFFF).map(lambda i: b"\x40\x02" + i.to_bytes(2, "big")),  # a plain PUBACK
            st.sampled_from([b"\x40\x03\x00\x07\x97", b"\x40\x02\x00", b"\xc0\x00", b"\x41\x02\x00\x01"]),
            st.binary(max_size=6),
        ),
        max_size=6,
    ),
    st.sampled_from([4, MQTT_50]),
)
def test_plain_puback_ids_answers_only_for_plain_pubacks_and_as_the_decoder_would(
    chunks: list[bytes], level: int
) -> None:
    data = b"".join(chunks)
    fast = plain_puback_ids(data)
    try:
        packets = Decoder(protocol_level=level).receive_data(data)
    except ALLOWED:
        assert fast is None
        return
    plain = bool(data) and all(isinstance(p, PubAck) and p.reason_code == 0 for p in packets)
    plain = plain and sum(len(encode(p, level)) for p in packets) == len(data)  # nothing left partial
    plain = plain and all(encode(p, level) == encode(p, 4) for p in packets)  # no reason code on the wire
    if plain:
        assert fast == [p.packet_id for p in packets if isinstance(p, PubAck)]
    else:
        assert fast is None


def test_plain_puback_ids_is_asked_only_at_a_packet_boundary() -> None:
    d = Decoder(protocol_level=4)
    assert d.at_packet_boundary()
    assert plain_puback_ids(b"\x40\x02\x00\x01\x40\x02\x00\x02") == [1, 2]
    assert d.receive_data(b"\x40\x02\x00") == []  # a partial PUBACK is buffered ...
    assert not d.at_packet_boundary()  # ... so the next read does not start a packet
    assert d.receive_data(b"\x03") == [PubAck(3)]
    assert d.at_packet_boundary()
    assert not Decoder().at_packet_boundary()  # before CONNECT nothing is known
    assert plain_puback_ids(b"") is None


# --- publish_fast: a PUBLISH on a known topic ------------------------------------------------------------------


def _outcome(d: Decoder, wire: bytes) -> list[Packet] | tuple[type[Exception], int | None]:
    try:
        return d.receive_data(wire)
    except ALLOWED as exc:
        return type(exc), exc.reason_code


@settings(max_examples=400, deadline=None)
@given(st.data(), st.sampled_from([4, MQTT_50]))
def test_a_decoder_that_knows_the_topic_decodes_like_a_fresh_one(data: st.DataObject, level: int) -> None:
    # A topic the decoder has decoded once takes the fast path after; mutated packets on it must come out, or be
    # refused, exactly as a decoder that never saw the topic decodes or refuses them.
    topic = "devices/d1/messages/events/"
    valid = [
        encode(Publish(topic, b"x" * 20, 1, packet_id=7), level),
        encode(Publish(topic, b"", 0), level),
        encode(Publish(topic, b"abc", 2, dup=True, retain=True, packet_id=65535), level),
        encode(PubAck(9), level),
    ]
    wire = bytearray(data.draw(st.sampled_from(valid)))
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    warm = Decoder(protocol_level=level)
    assert warm.receive_data(valid[0]) == Decoder(protocol_level=level).receive_data(valid[0])
    assert _outcome(warm, bytes(wire)) == _outcome(Decoder(protocol_level=level), bytes(wire))


@pytest.mark.parametrize("level", [4, MQTT_50])
def test_publishes_on_a_known_topic_split_anywhere_decode_the_same(level: int) -> None:
    p1 = Publish("a/b", b"1" * 150, 1, packet_id=1)
    p2 = Publish("a/b", b"2", 1, packet_id=2)
    props = Properties({PropertyId.CONTENT_TYPE: "json"}, (("k", "v"),))
    p3 = Publish("a/b", b"3", 1, packet_id=3, properties=props if level == MQTT_50 else Properties())
    stream = encode(p1, level) + encode(p2, level) + encode(p3, level) + encode(PubAck(4), level)
    for cut in range(len(stream) + 1):
        d = Decoder(protocol_level=level)
        assert d.receive_data(stream[:cut]) + d.receive_data(stream[cut:]) == [p1, p2, p3, PubAck(4)]


# --- encode_qos1_publish and puback_success: the bytes of a delivery and of its ack ------------------------


@settings(max_examples=200, deadline=None)
@given(
    topic=st.text(min_size=1, max_size=40),
    payload_len=st.sampled_from([0, 1, 100, 120, 125, 16_370, 16_380, 2_097_140]),
    packet_id=st.integers(1, 0xFFFF),
    dup=st.booleans(),
    level=st.sampled_from([MQTT_311, MQTT_50]),
)
def test_encode_qos1_publish_gives_the_bytes_encode_gives(
    topic: str, payload_len: int, packet_id: int, dup: bool, level: int
) -> None:
    # Payload sizes around the 1-, 2- and 3-byte remaining lengths (127, 16,383, 2,097,151).
    payload = b"p" * payload_len
    fast = encode_qos1_publish(topic, payload, packet_id, dup=dup, v5=level == MQTT_50)
    assert fast == encode(Publish(topic, payload, 1, False, dup, packet_id), level)


def test_encode_qos1_publish_refuses_what_encode_refuses() -> None:
    with pytest.raises(UnencodableField, match="over MQTT's 65,535"):
        encode_qos1_publish("t" * 0x10000, b"", 1)
    with pytest.raises(UnencodableField, match="not UTF-8"):
        encode_qos1_publish("t\ud800", b"", 1)
    for bad in (0, 0x10000):
        with pytest.raises(LocalProtocolError, match="packet identifier"):
            encode_qos1_publish("t", b"", bad)


@given(st.integers(1, 0xFFFF), st.sampled_from([MQTT_311, MQTT_50]))
def test_puback_success_gives_the_bytes_encode_gives(packet_id: int, level: int) -> None:
    assert puback_success(packet_id) == encode(PubAck(packet_id), level)
