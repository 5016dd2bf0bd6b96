"""The records' byte layout.

The ingest path encodes records from plain tuples (no struct built, no dict copied); these tests hold it to the
exact bytes of the msgspec structs that ``decode_*`` read.
"""

from __future__ import annotations

import msgspec
import pytest

from edgehub.core import Message, StoreError, SystemProperty
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
