"""Fuzzing the MQTT codec and the sans-IO server connection: random bytes, mutated valid packets of every type
(3.1.1 and 5.0, with properties), valid streams split anywhere, and round trips (tests/fuzz/mqtt_checks.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import MQTT_50, MQTT_311, Connect, Packet, ReasonCode
from protocol_heads.mqtt.connection import MessageReceived, ProtocolFailed
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.mqtt_checks import check_connection, check_decoder, check_round_trip
from tests.fuzz.mqtt_inputs import levels, mutated, packets, session_bytes, split


@fuzz_settings(200)
@given(st.lists(st.binary(max_size=64), max_size=5), st.sampled_from([None, MQTT_311, MQTT_50]), st.integers(2, 300))
def test_random_bytes_give_only_declared_errors_however_they_are_read(
    chunks: list[bytes], level: int | None, max_packet_size: int
) -> None:
    check_decoder(chunks, level, max_packet_size)


@fuzz_settings(200)
@given(st.data(), levels)
def test_valid_packets_of_every_type_round_trip(data: st.DataObject, level: int) -> None:
    check_round_trip(data.draw(packets(level)), level)


@fuzz_settings(200)
@given(st.data(), levels)
def test_valid_streams_split_anywhere_decode_as_in_one_read(data: st.DataObject, level: int) -> None:
    stream = data.draw(st.lists(packets(level), min_size=1, max_size=5))
    wires = [encode(p, level) for p in stream if not isinstance(p, Connect)]
    check_decoder(data.draw(split(b"".join(wires))), level)


@fuzz_settings(250)
@given(st.data(), levels)
def test_mutated_packets_of_every_type_give_only_declared_errors(data: st.DataObject, level: int) -> None:
    packet: Packet = data.draw(packets(level))
    wire = data.draw(mutated(encode(packet, level)))
    decoder_level = None if isinstance(packet, Connect) else level
    check_decoder(data.draw(split(wire)), decoder_level, data.draw(st.sampled_from([64, 1 << 20])))


@fuzz_settings(200)
@given(st.data(), st.booleans())
def test_server_connection_never_raises_on_sessions_mutated_and_split(data: st.DataObject, mutate: bool) -> None:
    wire = data.draw(session_bytes())
    if mutate:
        wire = data.draw(mutated(wire))
    settle = data.draw(st.sampled_from([ReasonCode.SUCCESS, ReasonCode.QUOTA_EXCEEDED]))
    check_connection(data.draw(split(wire)), settle_code=settle, refuse=data.draw(st.booleans()))


@fuzz_settings(200)
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_server_connection_never_raises_on_random_bytes(chunks: list[bytes]) -> None:
    check_connection(chunks)


def test_a_broken_packet_after_good_ones_fails_the_connection_and_closes_it() -> None:
    # The checks are not vacuous: a valid session then a reserved packet type ends in ProtocolFailed, CLOSED.
    from edgehub.mqtt.packets import Publish

    wire = encode(Connect("c", MQTT_50), MQTT_50) + encode(Publish("t", b"1", 1, packet_id=1), MQTT_50) + b"\x00\x00"
    events = check_connection([wire])
    assert isinstance(events[-1], ProtocolFailed)
    assert events[-1].error.reason_code == ReasonCode.MALFORMED_PACKET
    assert not any(isinstance(e, MessageReceived) for e in events)  # the read with the error is dropped whole
