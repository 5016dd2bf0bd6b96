"""zstd segments made readable for the query: each new ``*.jsonl.zst`` segment of the landing zone decoded in the
driver, with the dictionary its frame names, and landed again as gzip for Spark's text source.

The hub's upload transport may land segments compressed with zstd and a dictionary trained on its traffic
(``{hub}/{lane}/pNN/{first}-{last}.jsonl.zst``), the dictionary itself once at ``dictionaries/{id:010d}.zdict``
before the first segment that uses it (docs/segment-format.md). Spark's text source reads gzip only (Hadoop's zstd
codec needs native libraries and knows no dictionaries), and the query has one source, whose checkpoint the job
reads (``spark_upload.spark_internals``). So before the query plans a batch, ``SegmentDecoder.run_pass`` decodes
every zstd segment that has no decoded copy yet and lands its lines as gzip at ``decoded/{its path}.jsonl.gz``,
inside the landing zone: the query reads that copy like any segment, so its records are classified and
deduplicated (by ``edge_message_id``) with every other, whatever codec each copy of a message came in.

Invariants:

* **Idempotent.** A decoded copy's name is a function of the segment's, and its bytes of the segment's lines (gzip
  ``mtime=0``); one that exists is never written again, so a restart or another pass decodes nothing twice and the
  query reads each copy once.
* **Visible whole or not at all.** Copies are written under a ``.`` name and renamed (``HadoopDir.publish``).
* **A bad segment never fails the job.** One that cannot be decoded (its dictionary is not in the landing zone;
  the file there is not the dictionary of that id; the frame is broken; it says it decompresses to more than
  ``max_segment_bytes``) gets a decoded copy of one line, ``{"undecodable_segment": REASON, "segment": PATH,
  "dict_id": ID, "error": TEXT}``, which the classification quarantines with the reason ``undecodable_segment``
  (the line kept, so the quarantine says which segment and why); it is logged once as
  ``ingest.segment_undecodable``. The decision is final for that segment: the hub lands a dictionary before any
  segment that uses it, so one missing now was lost, not late.
* **Bounded.** A pass decodes at most ``max_segments_per_pass`` segments (the rest wait for the next pass); a
  segment is decompressed only when its frame states a content size within ``max_segment_bytes``.

The decoding runs in the driver, ``workers`` segments at a time (threads: the cost is per file, about 20 Hadoop
calls through py4j to read it, write its copy under a temp name and rename it, each a round trip to the JVM that
threads overlap; zstd decompresses at hundreds of MB/s and the gzip copy is written at level 1). On 200 segments of
100 messages, one thread took 5.2 s, four 2.0 s (a loaded 2-core machine); ``bench.upload_codec --spark`` compares
the job over such segments with the job over the same messages as gzip. The pool's threads live as long as the
decoder (``stop`` ends them), so each keeps its one py4j connection.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from edgehub.upstream.segment import (
    DICTIONARY_FOLDER,
    SEGMENT_SUFFIX,
    ZSTD_SEGMENT_SUFFIX,
    SegmentFormatError,
    UnknownDictionaryError,
    dictionary_id,
    dictionary_path,
    segment_dictionary_id,
    zstd_plain_bytes,
)
from spark_upload.spark_internals import HadoopDir

__all__ = [
    "DECODED_FOLDER",
    "UNDECODABLE_KEY",
    "DecodePass",
    "SegmentDecoder",
    "decoded_path",
]

_log = logging.getLogger(__name__)

DECODED_FOLDER = "decoded"
UNDECODABLE_KEY = "undecodable_segment"  # the one key of a decoded copy's line that says the segment was not
MAX_SEGMENT_BYTES = 256 << 20  # decompressed; a hub's segment is a batch of at most 10,000 messages
MAX_SEGMENTS_PER_PASS = 10_000
# Where the hub's segments are (SegmentName.path), as a Hadoop glob: hub, lane, priority folder, file.
_ZSTD_SEGMENTS = f"*/*/p[0-9][0-9]/*{ZSTD_SEGMENT_SUFFIX}"
_DECODED_COPIES = f"{DECODED_FOLDER}/*/*/p[0-9][0-9]/*{SEGMENT_SUFFIX}"


def decoded_path(segment_path: str) -> str:
    """Where the decoded copy of the zstd segment at ``segment_path`` (relative to the landing root) lands."""
    if not segment_path.endswith(ZSTD_SEGMENT_SUFFIX):
        raise ValueError(f"{segment_path!r} is not a zstd segment's path")
    return f"{DECODED_FOLDER}/{segment_path.removesuffix(ZSTD_SEGMENT_SUFFIX)}{SEGMENT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class DecodePass:
    """What one pass did: segments decoded, segments found undecodable (each with a decoded copy that says so),
    and segments left for the next pass (over ``max_segments_per_pass``)."""

    decoded: int = 0
    undecodable: int = 0
    left: int = 0


class _Undecodable(Exception):
    def __init__(self, reason: str, error: str, dict_id: int | None = None) -> None:
        super().__init__(error)
        self.reason, self.error, self.dict_id = reason, error, dict_id


class SegmentDecoder:
    """Decodes the landing zone's zstd segments for the query (see the module docstring). ``run_pass`` is safe to
    call from any thread, one pass at a time; ``start``/``stop`` run passes every ``interval_s`` in a daemon
    thread (the continuous trigger); ``stop`` waits for a pass in progress and ends the workers (call it when
    done, also after passes run by hand)."""

    def __init__(
        self,
        landing: HadoopDir,
        *,
        max_segments_per_pass: int = MAX_SEGMENTS_PER_PASS,
        max_segment_bytes: int = MAX_SEGMENT_BYTES,
        workers: int = 4,
    ) -> None:
        if max_segments_per_pass < 1 or max_segment_bytes < 1 or workers < 1:
            raise ValueError("max_segments_per_pass, max_segment_bytes and workers must be positive")
        self._landing = landing
        self.max_segments_per_pass = max_segments_per_pass
        self.max_segment_bytes = max_segment_bytes
        self._dictionaries: dict[int, bytes] = {}  # read by the workers; a race reads a dictionary twice, no harm
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None  # what stopped the background passes, if anything did

    def run_pass(self) -> DecodePass:
        """Decode every zstd segment without a decoded copy (at most ``max_segments_per_pass``)."""
        with self._lock:
            landing = self._landing
            done = set(landing.glob(_DECODED_COPIES))
            todo = [p for p in landing.glob(_ZSTD_SEGMENTS) if decoded_path(p) not in done]
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="edgehub-decode")
            outcomes = list(self._pool.map(self._decode, todo[: self.max_segments_per_pass]))
            decoded = sum(outcomes)
            undecodable = len(outcomes) - decoded
            result = DecodePass(decoded, undecodable, max(0, len(todo) - self.max_segments_per_pass))
        if todo:
            _log.info(
                "ingest.decode_pass decoded=%d undecodable=%d left=%d", result.decoded, result.undecodable, result.left
            )
        return result

    def _decode(self, path: str) -> bool:
        """Land the decoded copy of ``path``; whether it holds the segment's lines."""
        copy, ok = self._decoded_copy(path)
        self._landing.publish(copy, *decoded_path(path).split("/"))
        return ok

    def _decoded_copy(self, path: str) -> tuple[bytes, bool]:
        """The gzip bytes of ``path``'s decoded copy, and whether it holds the segment's lines (else the one line
        that says why not)."""
        data = self._landing.read_bytes(path) or b""
        try:
            lines = self._plain(data)
        except _Undecodable as exc:
            _log.warning(
                "ingest.segment_undecodable segment=%s reason=%s dict_id=%s error=%s",
                path,
                exc.reason,
                exc.dict_id,
                exc.error,
            )
            line = {UNDECODABLE_KEY: exc.reason, "segment": path, "dict_id": exc.dict_id, "error": exc.error}
            return gzip.compress(json.dumps(line).encode() + b"\n", compresslevel=1, mtime=0), False
        return gzip.compress(lines, compresslevel=1, mtime=0), True

    def _plain(self, data: bytes) -> bytes:
        try:
            dict_id = segment_dictionary_id(data)
            size = _zstd_content_size(data)
        except SegmentFormatError as exc:
            raise _Undecodable("broken_frame", str(exc)) from exc
        if size is None:  # the hub always states it; without it there is no bound before decompressing
            raise _Undecodable("no_content_size", "the frame does not state its decompressed size", dict_id)
        if size > self.max_segment_bytes:
            raise _Undecodable(
                "too_large", f"the frame states {size} bytes; at most {self.max_segment_bytes} are read", dict_id
            )
        dictionaries = {}
        if dict_id:
            dictionaries[dict_id] = self._dictionary(dict_id)
        try:
            return zstd_plain_bytes(data, dictionaries)
        except UnknownDictionaryError as exc:
            raise _Undecodable("unknown_dictionary", str(exc), dict_id) from exc
        except SegmentFormatError as exc:
            raise _Undecodable("broken_frame" if not dict_id else "bad_dictionary", str(exc), dict_id) from exc

    def _dictionary(self, dict_id: int) -> bytes:
        """Dictionary ``dict_id`` from the landing zone (kept once read: ids name contents)."""
        found = self._dictionaries.get(dict_id)
        if found is not None:
            return found
        data = self._landing.read_bytes(*dictionary_path(dict_id).split("/"))
        if data is None:
            raise _Undecodable(
                "unknown_dictionary",
                f"no {dictionary_path(dict_id)} in the landing zone's {DICTIONARY_FOLDER}/",
                dict_id,
            )
        if dictionary_id(data) != dict_id:
            raise _Undecodable(
                "bad_dictionary", f"{dictionary_path(dict_id)} is not zstd dictionary {dict_id}", dict_id
            )
        self._dictionaries[dict_id] = data
        return data

    # -- background passes (continuous trigger) ----------------------------------------------------------------

    def start(self, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        if self._thread is not None:
            raise RuntimeError("the decoder runs already")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="edgehub-decoder", daemon=True)
        self._thread.start()

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.run_pass()
            except Exception as exc:  # a landing zone that fails now may answer at the next pass
                _log.warning("ingest.decode_pass_failed error=%s", exc)
                self.failure = exc

    def stop(self) -> None:
        """End the background passes (waiting for one in progress) and the workers."""
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _zstd_content_size(data: bytes) -> int | None:
    """The decompressed size a zstd frame states; None when it states none."""
    zstandard: Any
    try:
        import zstandard
    except ImportError as exc:
        raise SegmentFormatError("zstd segments need the zstandard package") from exc
    try:
        size = int(zstandard.get_frame_parameters(data).content_size)
    except zstandard.ZstdError as exc:
        raise SegmentFormatError(f"not a zstd segment: {exc}") from exc
    return None if size == zstandard.CONTENTSIZE_UNKNOWN else size
