"""How records are laid out on disk: msgspec msgpack arrays, each starting with a format version. Never pickle.

Keys are big-endian u64 so that RocksDB's byte order is numeric order. A version we do not know raises
``StoreError`` naming it, so an old binary never misreads a newer store.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import msgspec

from edgehub.core import Message, StoreError

__all__ = [
    "CheckpointRecord",
    "DeadLetterRecord",
    "MessageRecord",
    "RefRecord",
    "decode_checkpoint",
    "decode_dead_letter",
    "decode_message",
    "decode_message_refs",
    "decode_message_sender_refs",
    "decode_ref",
    "encode_checkpoint",
    "encode_dead_letter",
    "encode_message",
    "encode_ref",
    "encode_ref_fields",
    "pack_u64",
    "unpack_u64",
]

VERSION = 1
_U64 = struct.Struct(">Q")


# The struct's own method, not a function around it: four calls per message stored and delivered.
pack_u64: Callable[[int], bytes] = _U64.pack


def unpack_u64(b: bytes) -> int:
    return int(_U64.unpack(b)[0])


class MessageRecord(msgspec.Struct, array_like=True, frozen=True):
    """A message body, written once; ``refs`` lists the (queue name, offset) pairs that point at it."""

    v: int
    body: bytes
    properties: dict[str, str | None]
    system_properties: dict[str, str]
    refs: list[tuple[str, int]]

    def to_message(self) -> Message:
        return Message(body=self.body, properties=self.properties, system_properties=self.system_properties)


class _MessageRefs(msgspec.Struct, array_like=True, frozen=True):
    """A ``MessageRecord`` read for its ``refs`` alone: the other fields are skipped, not decoded (removal needs
    only to know which references point at a body)."""

    v: int
    body: msgspec.Raw
    properties: msgspec.Raw
    system_properties: msgspec.Raw
    refs: list[tuple[str, int]]


class _Sender(msgspec.Struct, frozen=True):
    """The two system properties that name who sent a message, decoded out of the map; the others are skipped
    without being built (a removal decodes one of these per message body it deletes)."""

    connectionDeviceId: str | None = None  # the property names, as stored
    connectionModuleId: str | None = None


class _MessageSenderRefs(msgspec.Struct, array_like=True, frozen=True):
    """A ``MessageRecord`` read for who sent it and its ``refs``: body and properties skipped."""

    v: int
    body: msgspec.Raw
    properties: msgspec.Raw
    system_properties: _Sender
    refs: list[tuple[str, int]]


class RefRecord(msgspec.Struct, array_like=True, frozen=True):
    """One queue's reference to a message: TTL and enqueue time fixed at enqueue."""

    v: int
    message_key: int
    enqueued_at_s: float
    ttl_s: float
    size_bytes: int


class CheckpointRecord(msgspec.Struct, array_like=True, frozen=True):
    """A queue's committed offset (-1: none yet), its health, and the highest offset ever removed."""

    v: int
    committed: int = -1
    unhealthy_since_s: float | None = None
    last_revival_s: float | None = None
    removed_high: int = -1


class DeadLetterRecord(msgspec.Struct, array_like=True, frozen=True):
    v: int
    queue: str
    offset: int
    message_key: int
    enqueued_at_s: float
    ttl_s: float
    size_bytes: int
    reason: str
    attempts: int
    error: str | None
    dead_at_s: float


_enc = msgspec.msgpack.Encoder()
_dec_msg = msgspec.msgpack.Decoder(MessageRecord)
_dec_msg_refs = msgspec.msgpack.Decoder(_MessageRefs)
_dec_msg_sender_refs = msgspec.msgpack.Decoder(_MessageSenderRefs)
_dec_ref = msgspec.msgpack.Decoder(RefRecord)
_dec_cp = msgspec.msgpack.Decoder(CheckpointRecord)
_dec_dl = msgspec.msgpack.Decoder(DeadLetterRecord)


def _check(v: int, what: str) -> None:
    if v != VERSION:
        raise StoreError(f"{what} record has format version {v}; this build reads version {VERSION}")


def encode_message(message: Message, refs: list[tuple[str, int]]) -> bytes:
    """A ``MessageRecord``'s bytes. Encoded as the tuple of its fields, which msgspec writes exactly as the
    array-like struct (the codec tests check it), without building the struct or copying the property dicts."""
    props, sp = message.properties, message.system_properties  # _plain in line: once per message stored
    return _enc.encode(
        (
            VERSION,
            message.body,
            props if type(props) is dict else dict(props),
            sp if type(sp) is dict else dict(sp),
            refs,
        )
    )


def decode_message(data: bytes) -> MessageRecord:
    try:
        rec = _dec_msg.decode(data)
    except msgspec.DecodeError as exc:
        raise StoreError(f"corrupt message record: {exc}") from exc
    _check(rec.v, "message")
    return rec


def decode_message_refs(data: bytes) -> list[tuple[str, int]]:
    """The ``refs`` of a ``MessageRecord``, without decoding its body and properties."""
    try:
        rec = _dec_msg_refs.decode(data)
    except msgspec.DecodeError as exc:
        raise StoreError(f"corrupt message record: {exc}") from exc
    _check(rec.v, "message")
    return rec.refs


def decode_message_sender_refs(data: bytes) -> tuple[str | None, str | None, list[tuple[str, int]]]:
    """The ``connectionDeviceId``, ``connectionModuleId`` and ``refs`` of a ``MessageRecord``, without decoding
    its body, its properties or its other system properties."""
    try:
        rec = _dec_msg_sender_refs.decode(data)
    except msgspec.DecodeError as exc:
        raise StoreError(f"corrupt message record: {exc}") from exc
    _check(rec.v, "message")
    sender = rec.system_properties
    return sender.connectionDeviceId, sender.connectionModuleId, rec.refs


def encode_ref(ref: RefRecord) -> bytes:
    return _enc.encode(ref)


def encode_ref_fields(message_key: int, enqueued_at_s: float, ttl_s: float, size_bytes: int) -> bytes:
    """``encode_ref(RefRecord(VERSION, ...))`` without building the struct (the ingest hot path)."""
    return _enc.encode((VERSION, message_key, enqueued_at_s, ttl_s, size_bytes))


def decode_ref(data: bytes) -> RefRecord:
    try:
        rec = _dec_ref.decode(data)
    except msgspec.DecodeError as exc:
        raise StoreError(f"corrupt reference record: {exc}") from exc
    _check(rec.v, "reference")
    return rec


def encode_checkpoint(cp: CheckpointRecord) -> bytes:
    return _enc.encode(cp)


def decode_checkpoint(data: bytes) -> CheckpointRecord:
    try:
        rec = _dec_cp.decode(data)
    except msgspec.DecodeError as exc:
        raise StoreError(f"corrupt checkpoint record: {exc}") from exc
    _check(rec.v, "checkpoint")
    return rec


def encode_dead_letter(rec: DeadLetterRecord) -> bytes:
    return _enc.encode(rec)


def decode_dead_letter(data: bytes) -> DeadLetterRecord:
    try:
        rec = _dec_dl.decode(data)
    except msgspec.DecodeError as exc:
        raise StoreError(f"corrupt dead-letter record: {exc}") from exc
    _check(rec.v, "dead-letter")
    return rec
