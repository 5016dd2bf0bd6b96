from __future__ import annotations

import base64
import gzip
import json
from dataclasses import replace
from typing import Any

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from edgehub import Message
from edgehub.upstream.segment import (
    Codec,
    SegmentFormatError,
    SegmentName,
    SegmentRecord,
    UnknownDictionaryError,
    decode_segment,
    dictionary_id,
    encode_segment,
    format_enqueued_at,
    record_from_message,
    segment_codec,
    segment_dictionary_id,
    segment_text,
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
        (b'{"v": 3}', "unsupported record version"),
        (b'{"v": "2"}', "unsupported record version"),
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


# --- record format v2 -----------------------------------------------------------------------------------------


def _lines(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gzip.decompress(data).decode().split("\n") if line]


def _v1_line(r: SegmentRecord) -> dict[str, object]:
    """The record as the v1 writer wrote it (the module docstring's v1 table)."""
    return {
        "v": 1,
        "edge_message_id": r.edge_message_id,
        "message_id": r.message_id,
        "device_id": r.device_id,
        "module_id": r.module_id,
        "hub_id": r.hub_id,
        "enqueued_at": r.enqueued_at,
        "priority": r.priority,
        "ttl_s": r.ttl_s,
        "source": r.source,
        "properties": dict(r.properties),
        "system_properties": dict(r.system_properties),
        "body": base64.b64encode(r.body).decode("ascii"),
    }


def _stamped(body: bytes, *, message_id: str | None = None) -> SegmentRecord:
    """A record as the hub writes it: the system properties the hub stamps, the edge id among them."""
    sp = {"connectionDeviceId": "pump", "connectionAuthMethod": '{"scope":"device","type":"sas"}'}
    sp |= {"edgeMessageId": "9f0c4a6e1b2d4c3e8f7a6b5c4d3e2f1a", "enqueuedTime": "2026-11-22T21:33:06.123456+00:00"}
    if message_id is not None:
        sp["messageId"] = message_id
    return record_from_message(
        Message(body=body, system_properties=sp),
        hub_id="hub1",
        edge_message_id=sp["edgeMessageId"],
        enqueued_at_s=1_700_000_000.5,
        priority=5,
        ttl_s=7200,
    )


@pytest.mark.parametrize(
    ("body", "field", "written"),
    [
        (b'{"t":21.5,"ok":true,"n":null,"s":"\xc3\xa9"}', "body_json", {"t": 21.5, "ok": True, "n": None, "s": "é"}),
        (b"[1,2,3]", "body_json", [1, 2, 3]),
        (b'"just a string"', "body_json", "just a string"),
        (b'{"t": 21}', "body_text", '{"t": 21}'),  # spaces: the compact form would not give these bytes back
        (b'{"t":21}  ', "body_text", '{"t":21}  '),  # padded, as the uplink bench's bodies are
        (b'{"t":1E5}', "body_text", '{"t":1E5}'),
        (b'{"a":1,"a":2}', "body_text", '{"a":1,"a":2}'),
        (b'{"u":"\\u00e9"}', "body_text", '{"u":"\\u00e9"}'),  # an escape the compact form would not write
        (b"[NaN]", "body_text", "[NaN]"),
        (b"null", "body_text", "null"),
        (b"", "body_text", ""),
        (b"plain text \xe2\x80\xa8 with a line separator", "body_text", "plain text \u2028 with a line separator"),
        (b"\xff\xfe\x00", "body_b64", "//4A"),
    ],
)
def test_v2_writes_the_body_as_json_text_or_base64_whichever_gives_the_bytes_back(
    body: bytes, field: str, written: object
) -> None:
    record = _stamped(body)
    data = encode_segment([record])
    (line,) = _lines(data)
    assert line["v"] == 2
    assert [k for k in line if k.startswith("body")] == [field]
    assert line[field] == written
    assert decode_segment(data) == [record]


def test_v2_writes_each_value_once_and_the_reader_restores_the_system_properties_that_are_columns() -> None:
    record = _stamped(b'{"t":21}', message_id="m-7")
    data = encode_segment([record])
    text = gzip.decompress(data).decode()
    for value in ("9f0c4a6e1b2d4c3e8f7a6b5c4d3e2f1a", '"pump"', '"m-7"'):
        assert text.count(value) == 1, value
    (line,) = _lines(data)
    assert line["system_properties"] == {
        "connectionAuthMethod": '{"scope":"device","type":"sas"}',
        "enqueuedTime": "2026-11-22T21:33:06.123456+00:00",
    }
    (decoded,) = decode_segment(data)
    assert dict(decoded.system_properties) == dict(record.system_properties)
    assert decoded.system_properties["edgeMessageId"] == "9f0c4a6e1b2d4c3e8f7a6b5c4d3e2f1a"


def test_a_column_the_message_had_no_system_property_for_is_written_as_a_null_the_reader_removes() -> None:
    # The transport derives an edge id for a message the hub did not stamp; the message has no edgeMessageId.
    record = SegmentRecord("hub1.upstream.3.7", "hub1", "2026-11-22T21:33:06.123Z", 3, 60, "/messages/events", b"x")
    (line,) = _lines(encode_segment([record]))
    assert line["system_properties"] == {"edgeMessageId": None}
    assert decode_segment(encode_segment([record])) == [record]
    # And a system property that differs from its column is kept as it is.
    odd = SegmentRecord(
        "e-1",
        "hub1",
        "2026-11-22T21:33:06.123Z",
        3,
        60,
        "/",
        b"x",
        device_id="d1",
        system_properties={"connectionDeviceId": "d2", "edgeMessageId": "e-1"},
    )
    (line,) = _lines(encode_segment([odd]))
    assert line["system_properties"] == {"connectionDeviceId": "d2"}
    assert decode_segment(encode_segment([odd])) == [odd]


def test_a_property_named_body_json_makes_the_writer_use_body_text() -> None:
    record = replace(_stamped(b'{"t":21}'), properties={"body_json": "x"})
    (line,) = _lines(encode_segment([record]))
    assert line["body_text"] == '{"t":21}'
    assert decode_segment(encode_segment([record])) == [record]


def test_v1_and_v2_lines_of_the_same_messages_decode_to_the_same_records_in_one_segment() -> None:
    records = [_stamped(b'{"t":21}', message_id="m-1"), _record(2, body=bytes(range(256))), _record(3)]
    v1 = [json.dumps(_v1_line(r)) for r in records]
    v2 = gzip.decompress(encode_segment(records)).decode().splitlines()
    mixed = "\n".join([v1[0], v2[1], v1[2], *v2, *v1]) + "\n"
    assert decode_segment(gzip.compress(mixed.encode())) == [records[0], records[1], records[2], *records, *records]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"body_text": "DROP"}, "a v2 record has exactly one of body_json, body_text, body_b64, not none"),
        ({"body_b64": "eA=="}, r"a v2 record has .* not \['body_text', 'body_b64'\]"),
        ({"body_text": None, "body_b64": "%%%"}, "body is not base64"),
        ({"body_text": 7}, "body_text must be a string"),
        ({"system_properties": {"contentType": None}}, "system_properties must map strings to strings"),
    ],
)
def test_a_v2_line_with_a_bad_body_or_system_property_is_refused(change: dict[str, object], problem: str) -> None:
    line = {**_lines(encode_segment([_stamped(b"text")]))[0], **change}
    text = json.dumps({k: v for k, v in line.items() if v != "DROP"})
    with pytest.raises(SegmentFormatError, match=f"line 1: {problem}"):
        decode_segment(gzip.compress(text.encode()))


def test_a_v2_line_whose_body_json_is_not_its_last_field_is_refused() -> None:
    (line,) = _lines(encode_segment([_stamped(b'{"t":21}')]))
    moved = {"body_json": line.pop("body_json"), **line}
    with pytest.raises(SegmentFormatError, match="line 1: body_json is not the record's last field"):
        decode_segment(gzip.compress(json.dumps(moved).encode()))


_texts = st.text(max_size=8)
_bodies = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=32).map(str.encode),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
        max_leaves=8,
    ).map(lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode()),
)
_column_keys = st.sampled_from(["edgeMessageId", "messageId", "connectionDeviceId", "connectionModuleId", "body_json"])


@given(
    body=_bodies,
    edge_id=_texts,
    ids=st.tuples(st.none() | _texts, st.none() | _texts, st.none() | _texts),
    properties=st.dictionaries(_texts | _column_keys, st.none() | _texts, max_size=3),
    system_properties=st.dictionaries(_texts | _column_keys, _texts, max_size=4),
)
def test_any_record_round_trips_through_v2(
    body: bytes,
    edge_id: str,
    ids: tuple[str | None, str | None, str | None],
    properties: dict[str, str | None],
    system_properties: dict[str, str],
) -> None:
    record = SegmentRecord(
        edge_message_id=edge_id,
        hub_id="hub1",
        enqueued_at="2026-11-22T21:33:06.123Z",
        priority=4,
        ttl_s=1.5,
        source="/messages/events",
        body=body,
        message_id=ids[0],
        device_id=ids[1],
        module_id=ids[2],
        properties=properties,
        system_properties=system_properties,
    )
    data = encode_segment([record, record])
    assert decode_segment(data) == [record, record]
    assert decode_segment(encode_segment([record], codec=Codec.ZSTD)) == [record]


def _dictionary_for(records: list[SegmentRecord]) -> bytes:
    lines = [line for line in segment_text(records).split(b"\n") if line]
    data: bytes = zstandard.train_dictionary(1024, list[bytes | bytearray | memoryview](lines)).as_bytes()
    return data


def test_a_segment_compressed_with_a_dictionary_names_it_and_decodes_only_with_it() -> None:
    records = [_record(i, body=b'{"t": %d, "unit": "celsius"}' % i) for i in range(400)]
    dictionary = _dictionary_for(records)
    dict_id = dictionary_id(dictionary)
    assert dict_id
    data = encode_segment(records[:20], codec=Codec.ZSTD, compresslevel=19, dictionary=dictionary)
    assert segment_codec(data) is Codec.ZSTD
    assert segment_dictionary_id(data) == dict_id
    assert len(data) < len(encode_segment(records[:20], codec=Codec.ZSTD, compresslevel=19))
    with pytest.raises(UnknownDictionaryError) as missing:
        decode_segment(data)
    assert missing.value.dict_id == dict_id
    assert decode_segment(data, {dict_id: dictionary}) == records[:20]
    plain = encode_segment(records[:20], codec=Codec.ZSTD)
    assert segment_dictionary_id(plain) == 0
    assert decode_segment(plain, {dict_id: dictionary}) == records[:20]  # a dictionary offered, none needed
    assert dictionary_id(plain) is None


def test_a_dictionary_goes_with_zstd_only() -> None:
    with pytest.raises(ValueError, match="zstd"):
        encode_segment([_record(0)], dictionary=b"\x37\xa4\x30\xec\x01\x00\x00\x00")
