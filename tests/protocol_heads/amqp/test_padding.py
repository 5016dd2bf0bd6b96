"""``padding.pad``: performatives written with every field, nothing else changed."""

from __future__ import annotations

from azure.eventhub._pyamqp._decode import decode_frame

from protocol_heads.amqp.padding import FIELDS, pad


def frame(code: int, fields: bytes, count: int, payload: bytes = b"") -> bytes:
    body = b"\x00\x53" + bytes([code]) + bytes([0xC0, len(fields) + 1, count]) + fields + payload
    return (8 + len(body)).to_bytes(4, "big") + b"\x02\x00\x00\x01" + body


def test_a_short_flow_gets_every_field_and_keeps_its_own() -> None:
    short = frame(0x13, b"\x43\x43", 2)  # next-incoming-id 0, incoming-window 0
    padded = pad(short)
    assert padded[6:8] == b"\x00\x01"  # the channel kept
    code, fields = decode_frame(memoryview(padded)[8:])
    assert code == 0x13
    assert len(fields) == FIELDS[0x13]
    assert fields[:2] == [0, 0]
    assert fields[2:] == [None] * (FIELDS[0x13] - 2)
    assert int.from_bytes(padded[:4], "big") == len(padded)


def test_a_transfer_keeps_its_payload_after_the_padded_fields() -> None:
    payload = b"\x00\x53\x75\xa0\x03abc"  # a data section
    short = frame(0x14, b"\x43", 1, payload)
    padded = pad(short)
    assert padded.endswith(payload)
    _, fields = decode_frame(memoryview(padded)[8:])
    assert len(fields) == FIELDS[0x14] + 1  # pyamqp appends the payload
    assert bytes(fields[-1]) == payload


def test_the_protocol_header_full_lists_and_unknown_frames_pass_unchanged() -> None:
    full = frame(0x17, b"\x40", 1)  # end with its one field
    empty = (8).to_bytes(4, "big") + b"\x02\x00\x00\x00"  # a heartbeat
    stream = b"AMQP\x00\x01\x00\x00" + full + empty
    assert pad(stream) == stream
    short = frame(0x18, b"", 0)
    assert pad(b"AMQP\x00\x01\x00\x00" + short).startswith(b"AMQP\x00\x01\x00\x00")
    assert pad(short + b"\x00\x00")[-2:] == b"\x00\x00"  # a cut-off tail is left as it is
