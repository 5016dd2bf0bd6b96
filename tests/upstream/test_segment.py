from __future__ import annotations

import gzip

import pytest

from edgehub import Message
from edgehub.upstream.segment import (
    Codec,
    SegmentFormatError,
    SegmentName,
    SegmentRecord,
    decode_segment,
    encode_segment,
    format_enqueued_at,
    record_from_message,
    segment_codec,
)


def _record(i: int, body: bytes = b'{"t": 21}') -> SegmentRecord:
    msg = Message(
        body=body,
        properties={"alert": "yes", "nothing": None, "ünï": "çødé"},
        system_properties={"connectionDeviceId": "dev1", "connectionModuleId": "m1", "messageId": f"m-{i}"},
    )
    return record_from_message(
        msg, hub_id="hub1", edge_message_id=f"e-{i}", enqueued_at_s=1_700_000_000.5 + i, priority=3, ttl_s=60
    )


def test_segment_round_trips_every_field() -> None:
    records = [_record(i, body=bytes(range(256))) for i in range(3)]
    decoded = decode_segment(encode_segment(records))
    assert decoded == records
    assert decoded[0].device_id == "dev1"
    assert decoded[0].module_id == "m1"
    assert decoded[0].message_id == "m-0"
    assert decoded[0].source == "/messages/modules/m1"
    assert decoded[0].properties["nothing"] is None


def test_same_records_give_the_same_bytes() -> None:
    assert encode_segment([_record(1)]) == encode_segment([_record(1)])


def test_enqueued_at_is_iso_utc_with_milliseconds() -> None:
    assert format_enqueued_at(1_700_000_000.5) == "2023-11-14T22:13:20.500Z"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"v": 2}', "unsupported record version"),
        (b'{"v": 1, "edge_message_id": "x"}', "missing fields"),
    ],
)
def test_decode_names_the_bad_line(line: bytes, problem: str) -> None:
    good = gzip.decompress(encode_segment([_record(1)]))
    with pytest.raises(SegmentFormatError, match=f"line 2: {problem}"):
        decode_segment(gzip.compress(good + line + b"\n"))


def test_decode_refuses_bytes_that_are_not_gzip() -> None:
    with pytest.raises(SegmentFormatError):
        decode_segment(b"plain text")


def test_segment_name_is_a_function_of_the_batch() -> None:
    name = SegmentName(hub_id="hub1", lane="upstream", priority=0, first_offset=5, last_offset=9)
    assert name.path == "hub1/upstream/p00/00000000000000000005-00000000000000000009.jsonl.gz"
    assert name == SegmentName(hub_id="hub1", lane="upstream", priority=0, first_offset=5, last_offset=9)
    with pytest.raises(ValueError):
        SegmentName(hub_id=".hidden", lane="upstream", priority=0, first_offset=0, last_offset=0)
    with pytest.raises(ValueError):
        SegmentName(hub_id="hub", lane="upstream", priority=0, first_offset=3, last_offset=2)


def test_a_zstd_segment_round_trips_and_says_its_codec_by_its_first_bytes() -> None:
    records = [_record(i, body=bytes(range(256))) for i in range(5)]
    data = encode_segment(records, codec=Codec.ZSTD, compresslevel=19)
    assert data[:4] == bytes.fromhex("28b52ffd")
    assert segment_codec(data) is Codec.ZSTD
    assert segment_codec(encode_segment(records)) is Codec.GZIP
    assert segment_codec(b"plain") is None
    assert decode_segment(data) == records
    assert encode_segment(records, codec=Codec.ZSTD, compresslevel=19) == data  # deterministic, as gzip is


def test_a_corrupt_zstd_segment_is_refused_as_a_segment_error() -> None:
    data = encode_segment([_record(0)], codec=Codec.ZSTD)
    with pytest.raises(SegmentFormatError, match="not a zstd UTF-8 segment"):
        decode_segment(data[:-3])
