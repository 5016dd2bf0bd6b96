"""The segment format: how a batch of messages leaves the hub for the cloud, record format version 2.

One segment is one upstream batch (one endpoint lane, one priority, a run of consecutive queue offsets): UTF-8
JSON lines, one record per message, compressed by one codec (gzip, or zstd with or without a trained dictionary).
The same bytes are the payload of an MQTT ``batch``-mode PUBLISH and the content of a landing-zone file, and the
Spark job (``spark_upload``) reads them too, so the format is specified once for all of them, field by field, in
docs/segment-format.md; this module is its reference implementation. Writers write version 2; readers read 1
and 2, in any mix.

Invariants: ``decode_segment(encode_segment(rs)) == rs`` (v1 and v2 records of one message decode to the same
``SegmentRecord``); decoding rejects unknown versions and malformed lines with ``SegmentFormatError`` naming the
line, and a segment whose dictionary it does not hold with ``UnknownDictionaryError`` naming the id; segment names
are a pure function of the batch (a retried upload makes no second copy) and never start with ``.`` or ``_``.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import importlib.util
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from edgehub.core import EdgeHubError, Message, SystemProperty

__all__ = [
    "BODY_FIELDS",
    "COLUMN_SYSTEM_PROPERTIES",
    "DICTIONARY_FOLDER",
    "LINE_FIELDS",
    "READ_VERSIONS",
    "RECORD_FIELDS",
    "SEGMENT_FORMAT_VERSION",
    "SEGMENT_SUFFIX",
    "SEGMENT_SUFFIXES",
    "ZSTD_SEGMENT_SUFFIX",
    "Codec",
    "SegmentFormatError",
    "SegmentName",
    "SegmentRecord",
    "UnknownDictionaryError",
    "compress_segment",
    "decode_segment",
    "dictionary_id",
    "dictionary_path",
    "encode_segment",
    "format_enqueued_at",
    "record_from_message",
    "segment_codec",
    "segment_dictionary_id",
    "segment_plain_text",
    "segment_text",
    "zstd_available",
    "zstd_plain_bytes",
]

SEGMENT_FORMAT_VERSION = 2  # what writers write
READ_VERSIONS: tuple[int, ...] = (1, 2)  # what readers read
SEGMENT_SUFFIX = ".jsonl.gz"  # a gzip segment's file name ends so: Spark's text source decodes it by this suffix
ZSTD_SEGMENT_SUFFIX = ".jsonl.zst"  # a zstd segment's (the Spark job decodes those itself, dictionary and all)
# The folder of the landing zone that holds the zstd dictionaries, each once, by id (``dictionary_path``).
DICTIONARY_FOLDER = "dictionaries"
# A decoded record, field for field (what bronze holds: the body as bytes; v is the version the line had). Spark's
# column names and types mirror these; spark_upload keeps its schema in step (a test checks it).
RECORD_FIELDS: tuple[str, ...] = (
    "v",
    "edge_message_id",
    "message_id",
    "device_id",
    "module_id",
    "hub_id",
    "enqueued_at",
    "priority",
    "ttl_s",
    "source",
    "properties",
    "system_properties",
    "body",
)
# The v2 body fields, in the order a writer tries them; exactly one is in a v2 record.
BODY_FIELDS: tuple[str, ...] = ("body_json", "body_text", "body_b64")
# The fields of a line, per record format version.
LINE_FIELDS: Mapping[int, tuple[str, ...]] = {1: RECORD_FIELDS, 2: (*RECORD_FIELDS[:-1], *BODY_FIELDS)}
# v2: system properties that are record columns, left out of system_properties when equal to the column.
COLUMN_SYSTEM_PROPERTIES: tuple[tuple[str, str], ...] = (
    (SystemProperty.EDGE_MESSAGE_ID.value, "edge_message_id"),
    (SystemProperty.MESSAGE_ID.value, "message_id"),
    (SystemProperty.CONNECTION_DEVICE_ID.value, "device_id"),
    (SystemProperty.CONNECTION_MODULE_ID.value, "module_id"),
)
_COLUMN_KEYS = frozenset(k for k, _ in COLUMN_SYSTEM_PROPERTIES)
_SEPARATORS = (",", ":")
_BODY_JSON_KEY = '"body_json":'
_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZDICT_MAGIC = b"\x37\xa4\x30\xec"


class Codec(StrEnum):
    """How a segment's JSON lines are compressed (docs/segment-format.md)."""

    GZIP = "gzip"
    ZSTD = "zstd"


# A landing-zone file's suffix says its codec, so a reader picks files by name before it opens them.
SEGMENT_SUFFIXES: Mapping[Codec, str] = {Codec.GZIP: SEGMENT_SUFFIX, Codec.ZSTD: ZSTD_SEGMENT_SUFFIX}


def zstd_available() -> bool:
    """Whether the optional ``zstandard`` package is installed (the zstd codec needs it)."""
    return importlib.util.find_spec("zstandard") is not None


class SegmentFormatError(EdgeHubError):
    """Bytes that are not a valid segment of a version we read."""


class UnknownDictionaryError(SegmentFormatError):
    """A segment compressed with a dictionary the reader does not hold (``dict_id``)."""

    def __init__(self, dict_id: int) -> None:
        super().__init__(f"the segment needs zstd dictionary {dict_id}, which this reader does not hold")
        self.dict_id = dict_id


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    """One message in a segment."""

    edge_message_id: str
    hub_id: str
    enqueued_at: str
    priority: int
    ttl_s: float
    source: str
    body: bytes
    message_id: str | None = None
    device_id: str | None = None
    module_id: str | None = None
    properties: Mapping[str, str | None] = field(default_factory=dict)
    system_properties: Mapping[str, str] = field(default_factory=dict)

    def to_json_obj(self) -> dict[str, object]:
        """The record as its v2 line's object (``body_json``, when used, is the last key)."""
        sysprops: dict[str, str | None] = dict(self.system_properties)
        for key, column in COLUMN_SYSTEM_PROPERTIES:
            value = getattr(self, column)
            if value is None:
                continue
            if key not in sysprops:
                sysprops[key] = None  # the column is set, the message had no such property
            elif sysprops[key] == value:
                del sysprops[key]
        clash = "body_json" in self.properties or "body_json" in sysprops
        body_key, body_value = _body_field(self.body, json_allowed=not clash)
        return {
            "v": SEGMENT_FORMAT_VERSION,
            "edge_message_id": self.edge_message_id,
            "message_id": self.message_id,
            "device_id": self.device_id,
            "module_id": self.module_id,
            "hub_id": self.hub_id,
            "enqueued_at": self.enqueued_at,
            "priority": self.priority,
            "ttl_s": self.ttl_s,
            "source": self.source,
            "properties": dict(self.properties),
            "system_properties": sysprops,
            body_key: body_value,
        }


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _body_field(body: bytes, *, json_allowed: bool) -> tuple[str, object]:
    """The v2 body field for ``body``: JSON when the compact form writes the same bytes back, else text, else
    base64 (docs/segment-format.md)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "body_b64", base64.b64encode(body).decode("ascii")
    if json_allowed:
        try:
            value = json.loads(text, parse_constant=_reject_constant)
            if value is not None and _compact(value) == text:
                return "body_json", value
        except (ValueError, RecursionError):  # not JSON, a number too long for int(), nested too deep
            pass
    return "body_text", text


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=_SEPARATORS, allow_nan=False)


def format_enqueued_at(epoch_s: float) -> str:
    """Epoch seconds as the segment's ISO 8601 UTC form with milliseconds."""
    dt = datetime.fromtimestamp(epoch_s, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def record_from_message(
    message: Message, *, hub_id: str, edge_message_id: str, enqueued_at_s: float, priority: int, ttl_s: float
) -> SegmentRecord:
    """The segment record of a queued message."""
    sp = message.system_properties
    return SegmentRecord(
        edge_message_id=edge_message_id,
        hub_id=hub_id,
        enqueued_at=format_enqueued_at(enqueued_at_s),
        priority=priority,
        ttl_s=ttl_s,
        source=message.source,
        body=message.body,
        message_id=sp.get(SystemProperty.MESSAGE_ID),
        device_id=sp.get(SystemProperty.CONNECTION_DEVICE_ID),
        module_id=sp.get(SystemProperty.CONNECTION_MODULE_ID),
        properties=dict(message.properties),
        system_properties=dict(sp),
    )


def encode_segment(
    records: Iterable[SegmentRecord],
    *,
    compresslevel: int = 6,
    codec: Codec = Codec.GZIP,
    dictionary: bytes | None = None,
) -> bytes:
    """The JSON lines of ``records``, compressed by ``codec`` at ``compresslevel`` (gzip 1-9, zstd 1-22), zstd
    with ``dictionary`` when given. The same records always give the same bytes (gzip ``mtime=0``). zstd without
    ``zstandard``, or a dictionary with gzip, raises ValueError."""
    return compress_segment(segment_text(records), compresslevel=compresslevel, codec=codec, dictionary=dictionary)


def segment_text(records: Iterable[SegmentRecord]) -> bytes:
    """The uncompressed segment: one JSON line per record, each ending in ``\\n``."""
    lines = [_compact(r.to_json_obj()) for r in records]
    return ("\n".join(lines) + ("\n" if lines else "")).encode("utf-8")


def compress_segment(
    text: bytes, *, compresslevel: int = 6, codec: Codec = Codec.GZIP, dictionary: bytes | None = None
) -> bytes:
    """``segment_text``'s bytes compressed (see ``encode_segment``)."""
    if codec is Codec.ZSTD:
        compressed: bytes = _compressor(compresslevel, dictionary).compress(text)
        return compressed
    if dictionary is not None:
        raise ValueError("a dictionary needs the zstd codec")
    return gzip.compress(text, compresslevel=compresslevel, mtime=0)


_local = threading.local()  # zstd (de)compressors are not for concurrent use: each thread keeps its own


def _cached(key: tuple[object, ...], make: Callable[[], Any]) -> Any:
    """A few zstd objects per thread, by key: loading a dictionary costs more than compressing a small segment."""
    cache: dict[tuple[object, ...], Any] | None = getattr(_local, "cache", None)
    if cache is None:
        cache = _local.cache = {}
    found = cache.get(key)
    if found is None:
        if len(cache) >= 8:
            cache.pop(next(iter(cache)))
        found = cache[key] = make()
    return found


def _compressor(level: int, dictionary: bytes | None) -> Any:
    zstandard = _zstd()
    if dictionary is None:
        return _cached(("c", level, None), lambda: zstandard.ZstdCompressor(level=level, write_content_size=True))

    def make() -> Any:
        zdict = zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_FULLDICT)
        return zstandard.ZstdCompressor(level=level, dict_data=zdict, write_content_size=True)

    return _cached(("c", level, dictionary), make)


def _decompressor(dictionary: bytes | None) -> Any:
    zstandard = _zstd()
    if dictionary is None:
        return _cached(("d", None), zstandard.ZstdDecompressor)

    def make() -> Any:
        zdict = zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_FULLDICT)
        return zstandard.ZstdDecompressor(dict_data=zdict)

    return _cached(("d", dictionary), make)


def dictionary_id(data: bytes) -> int | None:
    """The id of a zstd dictionary payload (its magic number, then the id little-endian); None when ``data`` is
    not one (a segment, or anything else)."""
    if len(data) < 8 or not data.startswith(_ZDICT_MAGIC):
        return None
    return int.from_bytes(data[4:8], "little")


def dictionary_path(dict_id: int) -> str:
    """Where a landing zone keeps zstd dictionary ``dict_id`` (relative to its root): written once, before the first
    segment compressed with it, by whoever lands such segments (the upload transport, the landing receiver)."""
    if not 0 < dict_id < 1 << 32:
        raise ValueError(f"a zstd dictionary id is a positive 32-bit number, not {dict_id}")
    return f"{DICTIONARY_FOLDER}/{dict_id:010d}.zdict"


def segment_dictionary_id(data: bytes) -> int:
    """The id of the dictionary a zstd segment was compressed with (its frame header); 0 when none (or not zstd)."""
    if not data.startswith(_ZSTD_MAGIC):
        return 0
    try:
        dict_id: int = _zstd().get_frame_parameters(data).dict_id
    except Exception as exc:  # zstandard.ZstdError: a header cut short or malformed
        raise SegmentFormatError(f"not a zstd segment: {exc}") from exc
    return dict_id


def _zstd() -> Any:
    """The ``zstandard`` module, imported only when a zstd segment is met (the Spark job never needs it)."""
    try:
        import zstandard
    except ImportError as exc:
        raise ValueError("the zstd codec needs the zstandard package: pip install edgehub[zstd]") from exc
    return zstandard


def segment_codec(data: bytes) -> Codec | None:
    """The codec of segment bytes, by their magic number; None when they are neither."""
    if data.startswith(_GZIP_MAGIC):
        return Codec.GZIP
    if data.startswith(_ZSTD_MAGIC):
        return Codec.ZSTD
    return None


def _str_or_none(obj: Mapping[str, object], key: str, line_no: int) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise SegmentFormatError(f"line {line_no}: {key} must be a string or null")
    return value


def _body(obj: dict[str, Any], line: str, line_no: int) -> bytes:
    if obj["v"] == 1:
        return _base64(obj["body"], line_no)
    present = [k for k in BODY_FIELDS if obj.get(k) is not None]
    if len(present) != 1:
        raise SegmentFormatError(
            f"line {line_no}: a v2 record has exactly one of {', '.join(BODY_FIELDS)}, not {present or 'none'}"
        )
    (key,) = present
    if key == "body_b64":
        return _base64(obj[key], line_no)
    if key == "body_text":
        text = obj[key]
        if not isinstance(text, str):
            raise SegmentFormatError(f"line {line_no}: body_text must be a string")
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate, written as a \u escape
            raise SegmentFormatError(f"line {line_no}: body_text is not UTF-8 text") from exc
    # body_json: its text in the line, which must end the record (docs/segment-format.md).
    stripped = line.rstrip(" \r")
    raw = stripped[stripped.index(_BODY_JSON_KEY) + len(_BODY_JSON_KEY) : -1].strip(" ")
    try:
        json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise SegmentFormatError(f"line {line_no}: body_json is not the record's last field") from exc
    return raw.encode("utf-8")


def _base64(value: object, line_no: int) -> bytes:
    if not isinstance(value, str):
        raise SegmentFormatError(f"line {line_no}: body is not base64")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SegmentFormatError(f"line {line_no}: body is not base64") from exc


def _system_properties(obj: dict[str, Any], line_no: int) -> dict[str, str]:
    sysprops = obj["system_properties"]
    if obj["v"] == 1:
        if not isinstance(sysprops, dict) or not all(isinstance(v, str) for v in sysprops.values()):
            raise SegmentFormatError(f"line {line_no}: system_properties must map strings to strings")
        return sysprops
    if not isinstance(sysprops, dict) or not all(
        isinstance(v, str) or (v is None and k in _COLUMN_KEYS) for k, v in sysprops.items()
    ):
        raise SegmentFormatError(
            f"line {line_no}: system_properties must map strings to strings (or null for {sorted(_COLUMN_KEYS)})"
        )
    out = {k: v for k, v in sysprops.items() if v is not None}
    for key, column in COLUMN_SYSTEM_PROPERTIES:
        value = obj[column]
        if key not in sysprops and value is not None:
            out[key] = value
    return out


def _record_from_obj(obj: object, line: str, line_no: int) -> SegmentRecord:
    if not isinstance(obj, dict):
        raise SegmentFormatError(f"line {line_no}: not a JSON object")
    version = obj.get("v")
    if type(version) is not int or version not in READ_VERSIONS:
        raise SegmentFormatError(f"line {line_no}: unsupported record version {version!r}")
    missing = [k for k in LINE_FIELDS[version] if k not in obj and k not in BODY_FIELDS]
    if missing:
        raise SegmentFormatError(f"line {line_no}: missing fields {missing}")
    for key in ("edge_message_id", "hub_id", "enqueued_at", "source"):
        if not isinstance(obj[key], str):
            raise SegmentFormatError(f"line {line_no}: {key} must be a string")
    message_id = _str_or_none(obj, "message_id", line_no)
    device_id = _str_or_none(obj, "device_id", line_no)
    module_id = _str_or_none(obj, "module_id", line_no)
    body = _body(obj, line, line_no)
    props = obj["properties"]
    if not isinstance(props, dict) or not all(isinstance(v, str | None) for v in props.values()):
        raise SegmentFormatError(f"line {line_no}: properties must map strings to strings or null")
    sysprops = _system_properties(obj, line_no)
    priority, ttl_s = obj["priority"], obj["ttl_s"]
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise SegmentFormatError(f"line {line_no}: priority must be an integer")
    if not isinstance(ttl_s, int | float) or isinstance(ttl_s, bool):
        raise SegmentFormatError(f"line {line_no}: ttl_s must be a number")
    return SegmentRecord(
        edge_message_id=obj["edge_message_id"],
        hub_id=obj["hub_id"],
        enqueued_at=obj["enqueued_at"],
        priority=priority,
        ttl_s=ttl_s,
        source=obj["source"],
        body=body,
        message_id=message_id,
        device_id=device_id,
        module_id=module_id,
        properties=props,
        system_properties=sysprops,
    )


def decode_segment(data: bytes, dictionaries: Mapping[int, bytes] | None = None) -> list[SegmentRecord]:
    """Every record of a segment (either codec, with or without a dictionary from ``dictionaries``, record
    versions 1 and 2), or ``SegmentFormatError`` naming the first bad line (1-based); ``UnknownDictionaryError``
    for a dictionary not in ``dictionaries``."""
    return _records(segment_plain_text(data, dictionaries))


def segment_plain_text(data: bytes, dictionaries: Mapping[int, bytes] | None = None) -> str:
    """A segment's JSON lines, decompressed (see ``decode_segment``), not parsed."""
    if segment_codec(data) is Codec.ZSTD:
        try:
            return zstd_plain_bytes(data, dictionaries).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SegmentFormatError(f"not a zstd UTF-8 segment: {exc}") from exc
    try:
        return gzip.decompress(data).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise SegmentFormatError(f"not a gzip'ed UTF-8 segment: {exc}") from exc


def zstd_plain_bytes(data: bytes, dictionaries: Mapping[int, bytes] | None = None) -> bytes:
    """A zstd segment's bytes decompressed, with its dictionary from ``dictionaries`` when it names one:
    ``UnknownDictionaryError`` when that is missing, ``SegmentFormatError`` when the frame does not decompress
    (or there is no ``zstandard``)."""
    try:
        zstandard = _zstd()
    except ValueError as exc:
        raise SegmentFormatError(f"a zstd segment, and {exc}") from exc
    dict_id = segment_dictionary_id(data)
    dictionary = None
    if dict_id:
        dictionary = dictionaries.get(dict_id) if dictionaries is not None else None
        if dictionary is None:
            raise UnknownDictionaryError(dict_id)
    try:
        raw: bytes = _decompressor(dictionary).decompress(data)
    except zstandard.ZstdError as exc:
        raise SegmentFormatError(f"not a zstd UTF-8 segment: {exc}") from exc
    return raw


def _records(text: str) -> list[SegmentRecord]:
    records = []
    # Lines end at "\n" only: str.splitlines would also cut at U+2028, U+0085 and others, which JSON strings
    # written with ensure_ascii=False hold unescaped.
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deep"
            raise SegmentFormatError(f"line {line_no}: not JSON ({msg})") from exc
        records.append(_record_from_obj(obj, line, line_no))
    return records


@dataclass(frozen=True, slots=True)
class SegmentName:
    """What a batch is, and so its name: ``{hub}/{lane}/p{priority:02d}/{first:020d}-{last:020d}{suffix}``, the
    suffix ``.jsonl.gz`` or ``.jsonl.zst`` by the codec (``SEGMENT_SUFFIXES``)."""

    hub_id: str
    lane: str  # the upstream lane: "upstream" or "upstream-p3" for partition 3
    priority: int
    first_offset: int
    last_offset: int
    codec: Codec = Codec.GZIP

    def __post_init__(self) -> None:
        for part in (self.hub_id, self.lane):
            if not _NAME_PART.match(part):
                raise ValueError(f"segment name part {part!r} must match {_NAME_PART.pattern}")
        if not 0 <= self.first_offset <= self.last_offset:
            raise ValueError(f"bad offset range {self.first_offset}..{self.last_offset}")

    @property
    def path(self) -> str:
        return (
            f"{self.hub_id}/{self.lane}/p{self.priority:02d}/"
            f"{self.first_offset:020d}-{self.last_offset:020d}{SEGMENT_SUFFIXES[self.codec]}"
        )
