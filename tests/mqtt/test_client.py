"""The codec's client side without I/O, as the upstream speaks it: the broker's packets decoded whatever way
their bytes are cut, MQTT 5 properties read (what ``CloudMessage`` carries), a bad packet refused with its reason
code, and the PUBLISH we write as long as ``publish_wire_bytes`` counts."""

from __future__ import annotations

import pytest

from edgehub.core import LocalProtocolError, RemoteProtocolError
from edgehub.mqtt.client import (
    BrokerDecoder,
    ConnAckIn,
    DisconnectIn,
    PacketIds,
    PingRespIn,
    PubAckIn,
    PublishIn,
    PublishProperties,
    SubAckIn,
    publish_packet,
)
from edgehub.upstream.mqtt.wire import publish_wire_bytes
from tests.upstream.scripted_broker import text, with_header


def test_a_v5_publish_cut_into_single_bytes_comes_out_whole_with_its_properties() -> None:
    props = b"".join(
        (
            b"\x26" + text("a") + text("1"),
            b"\x03" + text("application/json"),
            b"\x09" + b"\x00\x03cid",
            b"\x26" + text("a") + text("2"),
            b"\x02\x00\x00\x00\x3c",  # Message Expiry Interval: read past, not kept
        )
    )
    body = text("devices/d1/messages/devicebound/") + b"\x01\x02" + bytes((len(props),)) + props + b"{}"
    decoder = BrokerDecoder(v5=True, max_packet_bytes=1024)
    wire = with_header(0x32, body)
    out = [p for i in range(len(wire)) for p in decoder.feed(wire[i : i + 1])]
    assert out == [
        PublishIn(
            "devices/d1/messages/devicebound/",
            b"{}",
            1,
            0x0102,
            (("a", "1"), ("a", "2")),
            "application/json",
            b"cid",
        )
    ]


def test_several_packets_in_one_read_come_out_in_order() -> None:
    decoder = BrokerDecoder(v5=True, max_packet_bytes=1024)
    connack_props = b"\x13\x00\x0a" + b"\x1f" + text("ok")
    wire = (
        with_header(0x20, b"\x01\x00" + bytes((len(connack_props),)) + connack_props)
        + b"\x40\x02\x00\x05"  # PUBACK, reason code left out: success
        + b"\x40\x04\x00\x06\x97\x00"  # PUBACK, quota exceeded, no properties
        + b"\x90\x05\x00\x07\x00\x01\x80"  # SUBACK: QoS 1, and a failure
        + b"\xd0\x00"
        + b"\xe0\x01\x8b"  # DISCONNECT, server shutting down
        + b"\x30\x05"  # the start of a PUBLISH: kept for the next read
    )
    assert decoder.feed(wire) == [
        ConnAckIn(True, 0, 10, "ok"),
        PubAckIn(5),
        PubAckIn(6, 0x97),
        SubAckIn(7, b"\x01\x80"),
        PingRespIn(),
        DisconnectIn(0x8B),
    ]
    assert decoder.feed(text("t") + b"\x00x") == [PublishIn("t", b"x", 0, 0)]


def test_an_mqtt5_connack_carries_the_brokers_receive_maximum_and_maximum_packet_size() -> None:
    props = b"\x21\x00\x14" + b"\x27\x00\x02\x00\x00"  # Receive Maximum 20, Maximum Packet Size 131,072
    wire = with_header(0x20, b"\x00\x00" + bytes((len(props),)) + props)
    assert BrokerDecoder(v5=True, max_packet_bytes=1024).feed(wire) == [ConnAckIn(False, 0, None, None, 20, 131_072)]
    for zero in (b"\x21\x00\x00", b"\x27\x00\x00\x00\x00"):  # 0 is a protocol error for both
        connack = with_header(0x20, b"\x00\x00" + bytes((len(zero),)) + zero)
        with pytest.raises(RemoteProtocolError, match="of 0") as caught:
            BrokerDecoder(v5=True, max_packet_bytes=1024).feed(connack)
        assert caught.value.reason_code == 0x82


def test_a_311_connack_carries_its_return_code() -> None:
    assert BrokerDecoder(v5=False, max_packet_bytes=1024).feed(b"\x20\x02\x00\x05") == [ConnAckIn(False, 5)]


@pytest.mark.parametrize(
    ("v5", "wire", "code", "why"),
    [
        (True, with_header(0x30, text("t") + b"\x02\x7f\x00"), 0x81, "unknown property 0x7f"),
        (True, with_header(0x30, text("t") + b"\x05\x03\x00\x09ab"), 0x81, "ends early"),
        (False, b"\x40\x03\x00\x01\x00", 0x81, "1 bytes after the packet's fields"),
        (False, b"\xe0\x00", 0x82, "DISCONNECT: not expected"),  # 3.1.1 has no server DISCONNECT
        (False, b"\xb0\x02\x00\x01", 0x82, "UNSUBACK: not expected"),
        (False, b"\x42\x02\x00\x01", 0x81, "reserved flags"),
        (False, b"\x32\x03\x00\x01t", 0x81, "ends early"),  # QoS 1 with no room for its packet id
        # a SUBACK announcing 1029 bytes (a PUBLISH that large is skipped and acked: test_skipped_publish.py)
        (False, b"\x90\x82\x08", 0x95, "packet of 1029 bytes is over the limit of 1024"),
    ],
)
def test_a_bad_packet_is_refused_with_its_reason_code(v5: bool, wire: bytes, code: int, why: str) -> None:
    with pytest.raises(RemoteProtocolError, match=why) as caught:
        BrokerDecoder(v5=v5, max_packet_bytes=1024).feed(wire)
    assert caught.value.reason_code == code


def test_the_publish_we_write_is_as_long_as_publish_wire_bytes_counts() -> None:
    props = PublishProperties((("edgehub-segment-version", "1"), ("k", "ü" * 70)), "application/x-edgehub-segment")
    payload = bytes(300)
    for v5, p, size in ((True, props, len(props.packed)), (True, None, 0), (False, None, None)):
        data = publish_packet("edgehub/segments/hub1/upstream/p00", payload, qos=1, packet_id=9, v5=v5, props=p)
        assert len(data) == publish_wire_bytes("edgehub/segments/hub1/upstream/p00", 300, properties_len=size)
        assert data.endswith(payload)
    with pytest.raises(LocalProtocolError):
        publish_packet("t", b"", qos=1, packet_id=0, v5=False)


def test_packet_ids_go_round_1_to_65535_and_skip_those_still_in_use() -> None:
    in_use = {65535, 1, 3}
    ids = PacketIds(last=65533)
    assert [ids.take(in_use.__contains__) for _ in range(3)] == [65534, 2, 4]
    assert PacketIds().take(lambda pid: pid != 40_000) == 40_000
    assert PacketIds().take(lambda pid: True) is None  # every id awaits its ack


@pytest.mark.parametrize("first", [0x10, 0x82, 0xA2, 0xC0])  # CONNECT, SUBSCRIBE, UNSUBSCRIBE, PINGREQ
def test_a_packet_only_clients_send_is_refused_from_a_broker_before_its_body_is_read(first: int) -> None:
    with pytest.raises(RemoteProtocolError, match="is not one a server sends") as caught:
        BrokerDecoder(v5=True, max_packet_bytes=1024).feed(with_header(first, b"\xff\xff"))  # no valid body
    assert caught.value.reason_code == 0x81
