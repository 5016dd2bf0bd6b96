"""The records' byte layout, and the stamps ``enqueue`` puts on a message.

The ingest path encodes records from plain tuples (no struct built, no dict copied); these tests hold it to the
exact bytes of the msgspec structs that ``decode_*`` read, and the stamps to ``uuid4`` and ``isoformat``.
"""

from __future__ import annotations

import uuid

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from edgehub.core import Message, StoreError, SystemProperty, utc_from_epoch
from edgehub.store import Store
from edgehub.store.codec import (
    VERSION,
    MessageRecord,
    RefRecord,
    decode_message,
    decode_message_refs,
    decode_ref,
    encode_message,
    encode_ref,
    encode_ref_fields,
)

STORE = Store.in_memory()


def test_reference_encoded_from_fields_is_byte_identical_to_the_struct() -> None:
    for fields in [(0, 0.0, 7200.0, 0), (2**64 - 1, 1_700_000_000.123456, 5.0, 262_144), (7, 1.5, 0.25, 200)]:
        assert encode_ref_fields(*fields) == encode_ref(RefRecord(VERSION, *fields))
        assert decode_ref(encode_ref_fields(*fields)) == RefRecord(VERSION, *fields)


def test_message_encoded_from_a_tuple_is_byte_identical_to_the_struct() -> None:
    message = Message(
        body=b"\x00body",
        properties={"kind": "data", "empty": None},
        system_properties={SystemProperty.CONNECTION_DEVICE_ID: "dev1"},
    )
    refs = [("q:p0:$upstream", 3), ("q:pdefault:/modules/m/inputs/in", 2**40)]
    record = MessageRecord(VERSION, message.body, dict(message.properties), dict(message.system_properties), refs)
    encoded = encode_message(message, refs)
    assert encoded == msgspec.msgpack.encode(record)
    decoded = decode_message(encoded)
    assert decoded.to_message() == message
    assert [tuple(r) for r in decoded.refs] == refs
    assert [tuple(r) for r in decode_message_refs(encoded)] == refs


def test_refs_alone_are_read_with_the_version_checked_and_corruption_named() -> None:
    newer = msgspec.msgpack.encode((VERSION + 1, b"b", {}, {}, [("q:p0:x", 1)]))
    with pytest.raises(StoreError, match=f"version {VERSION + 1}"):
        decode_message_refs(newer)
    with pytest.raises(StoreError, match="corrupt message record"):
        decode_message_refs(b"\x93\x01")


@given(st.floats(min_value=0, max_value=2**32, allow_nan=False, allow_infinity=False))
@example(0.0)
@example(1_700_000_000.0)
@example(1_700_000_000.9999995)  # rounds up into the next second
@example(1_700_000_000.0000005)
def test_stamped_enqueued_time_reads_exactly_as_isoformat(epoch_s: float) -> None:
    stamped = STORE.stamp(Message(body=b"x"), epoch_s)
    assert stamped.system_properties[SystemProperty.ENQUEUED_TIME] == utc_from_epoch(epoch_s).isoformat()


def test_stamped_edge_message_ids_are_distinct_version_4_uuids() -> None:
    ids = [STORE.stamp(Message(body=b"x"), 0.0).edge_message_id for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        assert text is not None
        assert len(text) == 32
        parsed = uuid.UUID(hex=text)
        assert (parsed.version, parsed.variant, parsed.hex) == (4, uuid.RFC_4122, text)


def test_stamps_already_present_are_kept() -> None:
    sp: dict[str, str] = {SystemProperty.EDGE_MESSAGE_ID: "mine", SystemProperty.ENQUEUED_TIME: "then"}
    message = Message(body=b"x", system_properties=sp)
    assert STORE.stamp(message, 5.0) is message
