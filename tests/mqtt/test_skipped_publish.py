"""A client's decoder that may meet a PUBLISH over its maximum packet size (MQTT 3.1.1 cannot tell the server a
limit): it yields the topic and packet id as a ``SkippedPublish`` and drops the payload as it arrives, whatever
the reads it comes in, so the client can acknowledge it and go on; every other oversize packet is still refused."""

from __future__ import annotations

import pytest

from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import MQTT_50, MQTT_311, PacketTooLarge, PubAck, Publish, SkippedPublish, SubAck

LIMIT = 2048


def client_decoder(level: int = MQTT_311) -> Decoder:
    return Decoder(protocol_level=level, max_packet_size=LIMIT, from_server=True, max_qos=1, skip_oversize_publish=True)


def big(qos: int = 1, packet_id: int | None = 7, level: int = MQTT_311) -> bytes:
    return encode(Publish("devices/d1/messages/devicebound/x", b"\xab" * 100_000, qos, packet_id=packet_id), level)


@pytest.mark.parametrize("level", [MQTT_311, MQTT_50])
def test_an_oversize_publish_in_one_read_is_skipped_and_the_packet_after_it_decoded(level: int) -> None:
    wire = big(level=level)
    after = encode(PubAck(9), level)
    got = client_decoder(level).receive_data(wire + after)
    assert got == [SkippedPublish("devices/d1/messages/devicebound/x", 1, 7, len(wire)), PubAck(9)]


@pytest.mark.parametrize("chunk", [1, 3, 40, 1000, 65536])
def test_an_oversize_publish_in_any_reads_is_skipped_once_and_its_payload_never_held(chunk: int) -> None:
    wire = big() + encode(Publish("t/next", b"small", 1, packet_id=8))
    decoder = client_decoder()
    got = []
    for i in range(0, len(wire), chunk):
        got += decoder.receive_data(wire[i : i + chunk])
        # what it keeps between reads is at most the packet's first bytes (its fixed header, topic and id)
        assert decoder.buffered_bytes() <= 64
    assert got == [
        SkippedPublish("devices/d1/messages/devicebound/x", 1, 7, len(big())),
        Publish("t/next", b"small", 1, packet_id=8),
    ]
    assert decoder.at_packet_boundary()


def test_an_oversize_qos0_publish_is_skipped_without_a_packet_id() -> None:
    [skipped] = client_decoder().receive_data(big(qos=0, packet_id=None))
    assert skipped == SkippedPublish("devices/d1/messages/devicebound/x", 0, None, len(big(qos=0, packet_id=None)))


def test_without_the_option_an_oversize_publish_is_still_refused() -> None:
    decoder = Decoder(protocol_level=MQTT_311, max_packet_size=LIMIT, from_server=True, max_qos=1)
    with pytest.raises(PacketTooLarge):
        decoder.receive_data(big()[:100])


def test_any_other_oversize_packet_is_still_refused_before_its_body() -> None:
    suback = encode(SubAck(1, tuple([0] * 5000)))
    with pytest.raises(PacketTooLarge):
        client_decoder().receive_data(suback[:10])
