"""The upload transport: ``$upstream`` as an ``Endpoint`` that lands each batch as one segment file.

``send`` encodes the batch as one segment (``edgehub.upstream.segment``, record format v2), names it after what
it is (``SegmentName``: hub, lane, priority, first and last offset) and hands both to a ``SegmentWriter``; the
write returning is the checkpoint. In production the writer is ``edgehub.upstream.landing.LandingZone``
(fsspec: a local folder by default, s3/abfs/gcs/... through plugins), which makes a write idempotent and
atomically visible; the composition root builds it from the configured URL and passes it here, so this module
does not depend on how or where files land.

**Codecs.** ``codec`` is gzip (the default; files ``*.jsonl.gz``) or zstd (files ``*.jsonl.zst``). With zstd and
a ``LaneDictionary`` (``edgehub.upstream.dictionary``, the same one the MQTT transport uses), the lane samples its
segments' lines, trains a dictionary from them in the background, and once one is trained lands it **once** at
``dictionaries/{id:010d}.zdict`` (``dictionary_path``) before the first segment compressed with it; the landing
write returning is what ``announced`` means here, so no segment that needs a dictionary lands before it. The
Spark job finds it there by the id the segment's zstd frame header carries (docs/segment-format.md).

Invariants:
* The same batch always gives the same name (codec included), so a retried upload of a batch whose first write
  did land never makes a second copy; gzip gives the same bytes too (``mtime=0``); a zstd retry may use a newer
  dictionary, and the first copy stays (both decode to the same records).
* All or nothing: the batch succeeded when the write returned; any failure fails the whole batch with the
  writer's ``TransportError.kind`` (other exceptions count as TRANSIENT). Nothing is invalid here: every
  message can be written.
* The write runs in a worker thread (fsspec calls block), one at a time, ever: a write that outlasts
  ``write_timeout_s`` fails its batch (TIMEOUT) but its thread runs on, and the next send waits for it (up to
  ``write_timeout_s`` again, then fails without writing) before it writes. So a slow or hung landing zone holds
  the executor back (back-pressure) and never piles up threads or writes.
* ``max_uplink_bps`` (``maxUplinkBps``) caps the bytes written as it caps MQTT's PUBLISH bytes: the same token
  bucket (``edgehub.upstream.bandwidth``), taken before each write; a segment above the bucket's burst goes
  when the bucket is full and leaves a debt the next ones pay, so the long-run rate holds.
* A dictionary is landed before any segment that uses it, and a failure to land it fails that batch like a
  failed segment write (the landing zone is what is failing); the batch goes again on the executor's schedule.
* zstd compression (level 19 by default: tens of milliseconds a segment) runs in a worker thread, so the event
  loop never waits for it.
* A failed write (refused, or timed out) reports the endpoint unreachable (``ReportsUnreachable``): the
  executor parks its queues and sends one probe at a time on its retry schedule instead of every priority
  trying on its own; the first write that succeeds afterwards calls ``on_reachable``.
* An outage is logged once, not once a probe: one warning (``upload.failing``) with the reason (the writer's
  ``TransportError.reason`` when it has one, as ``LandingError`` does: ``no_such_bucket``, ``bad_credentials``,
  ...) when writes start failing or fail for another reason, and one line (``upload.recovered``) with the count
  of failed writes when one lands again; the failures between are logged at debug.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from edgehub.core import Clock, FailureKind, SystemClock, TransportError
from edgehub.core.endpoints import UPSTREAM_ENDPOINT, UPSTREAM_LANE
from edgehub.delivery.endpoint import QueuedMessage, SendResult
from edgehub.upstream.bandwidth import TokenBucket
from edgehub.upstream.batching import batch_text, segment_name
from edgehub.upstream.dictionary import LaneDictionary
from edgehub.upstream.segment import Codec, SegmentName, compress_segment, dictionary_path

__all__ = ["DEFAULT_LEVELS", "SegmentWriter", "UploadTransport"]

log = logging.getLogger(__name__)

_BURST_BYTES = 65_536  # the uplink bucket's burst: a larger segment goes when it is full, and leaves a debt
# Each codec's level unless told otherwise: gzip's usual one; zstd's as on the MQTT transport (small segments gain
# most from a high level, and the upload link is the thin part).
DEFAULT_LEVELS = {Codec.GZIP: 6, Codec.ZSTD: 19}


class SegmentWriter(Protocol):
    """Where segments land. ``LandingZone`` is the implementation; it raises ``TransportError`` on failure."""

    def write(self, name: SegmentName, data: bytes) -> object:
        """Store ``data`` under ``name``, idempotently; return once it is durable and visible."""
        ...

    def write_path(self, relative_path: str, data: bytes) -> object:
        """``write`` for a file that is not a segment (a zstd dictionary at ``dictionary_path``)."""
        ...


class UploadTransport:
    """An Endpoint that uploads one segment per batch through a ``SegmentWriter``."""

    def __init__(
        self,
        writer: SegmentWriter,
        *,
        hub_id: str,
        lane: str = UPSTREAM_LANE,
        endpoint_id: str = UPSTREAM_ENDPOINT,
        max_batch_messages: int = 10_000,
        codec: Codec = Codec.GZIP,
        compresslevel: int | None = None,
        dictionary: LaneDictionary | None = None,
        dictionary_side: str | None = None,
        max_uplink_bps: float | None = None,
        write_timeout_s: float = 120.0,
        clock: Clock | None = None,
    ) -> None:
        if max_batch_messages <= 0:
            raise ValueError("max_batch_messages must be positive")
        if write_timeout_s <= 0:
            raise ValueError("write_timeout_s must be positive")
        if dictionary is not None and codec is not Codec.ZSTD:
            raise ValueError("a dictionary needs the zstd codec")
        level = DEFAULT_LEVELS[codec] if compresslevel is None else compresslevel
        # The codec's own bounds, checked here: a bad level would otherwise fail every batch, forever.
        if not (1 <= level <= 9 if codec is Codec.GZIP else 1 <= level <= 22):
            raise ValueError(f"compresslevel {level} is out of range for {codec} (gzip 1-9, zstd 1-22)")
        if codec is Codec.ZSTD:
            compress_segment(b"", codec=codec)  # ValueError now, not per batch, without the zstandard package
        SegmentName(hub_id=hub_id, lane=lane, priority=0, first_offset=0, last_offset=0)  # validates the parts
        self._writer = writer
        self.hub_id = hub_id
        self.lane = lane
        self._endpoint_id = endpoint_id
        self._max_batch_messages = max_batch_messages
        self.codec = codec
        self.compresslevel = level
        self.dictionary = dictionary
        self.dictionary_side = dictionary_side  # the far side this zone is, for a dictionary the lane's links share
        self._training: asyncio.Task[object] | None = None
        self.write_timeout_s = write_timeout_s
        self._clock: Clock = clock or SystemClock()
        self._bucket = TokenBucket(rate_bps=max_uplink_bps, burst_bytes=_BURST_BYTES, clock=self._clock)
        self._on_reachable: Callable[[], None] = lambda: None
        self._on_unreachable: Callable[[], None] = lambda: None
        self._failing = False
        self._failing_reason: str | None = None  # the reason the outage under way was logged with
        self._failed_writes = 0  # in the outage under way
        self._failing_since = 0.0  # monotonic
        self._writing: asyncio.Future[object] | None = None  # the last write's thread, until it returns
        self.segments_written = 0
        self.bytes_written = 0
        self.messages_written = 0
        self.dictionaries_landed = 0
        self._landed: set[int] = set()  # dictionary ids this transport has landed (or found landed)

    @property
    def endpoint_id(self) -> str:
        return self._endpoint_id

    @property
    def writer(self) -> SegmentWriter:
        """Where the segments go (a ``LandingZone`` in production)."""
        return self._writer

    @property
    def max_batch_messages(self) -> int:
        return self._max_batch_messages

    def bind(self, on_reachable: Callable[[], None]) -> None:
        self._on_reachable = on_reachable

    def bind_unreachable(self, on_unreachable: Callable[[], None]) -> None:
        self._on_unreachable = on_unreachable

    @property
    def max_uplink_bps(self) -> float | None:
        return self._bucket.rate_bps

    def set_max_uplink_bps(self, rate_bps: float | None) -> None:
        self._bucket.set_rate(rate_bps)

    async def _write(self, write: Callable[[], object], size: int) -> None:
        """One write, after the one before it has returned, within ``write_timeout_s`` (each wait)."""
        previous = self._writing
        if previous is not None and not previous.done():
            try:
                async with asyncio.timeout(self.write_timeout_s):
                    await asyncio.shield(previous)
            except TimeoutError as exc:
                raise TransportError(
                    f"the previous write is still running after {self.write_timeout_s}s", kind=FailureKind.TIMEOUT
                ) from exc
        await self._bucket.take(size)
        writing = asyncio.ensure_future(asyncio.to_thread(write))
        # Its outcome is awaited below or, after a timeout, by nobody: read it so it is never reported unread.
        writing.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._writing = writing
        try:
            async with asyncio.timeout(self.write_timeout_s):
                await asyncio.shield(writing)
        except TimeoutError as exc:
            raise TransportError(f"no answer within {self.write_timeout_s}s", kind=FailureKind.TIMEOUT) from exc

    async def send(self, batch: Sequence[QueuedMessage]) -> SendResult:
        if not batch:
            return SendResult()
        try:
            name = segment_name(batch, hub_id=self.hub_id, lane=self.lane, codec=self.codec)
        except ValueError as exc:  # a batch mixing priorities is the executor's bug, not the messages'
            return SendResult.all_failed(batch, FailureKind.PERMANENT, str(exc))
        try:
            await self._land_dictionary()
            data = await self._encode(batch)
            await self._write(functools.partial(self._writer.write, name, data), len(data))
        except TransportError as exc:
            reason = getattr(exc, "reason", None) or ("timeout" if exc.kind is FailureKind.TIMEOUT else "error")
            self._log_failure(name.path, reason, exc.kind, str(exc))
            return self._failed(batch, exc.kind, str(exc))
        except Exception as exc:
            self._log_failure(name.path, "error", FailureKind.TRANSIENT, repr(exc))
            return self._failed(batch, FailureKind.TRANSIENT, repr(exc))
        self.segments_written += 1
        self.bytes_written += len(data)
        self.messages_written += len(batch)
        if self._failing:
            self._failing = False
            log.info(
                "upload.recovered lane=%s failed_writes=%d failing_for_s=%.1f",
                self.lane,
                self._failed_writes,
                self._clock.monotonic() - self._failing_since,
            )
            self._failing_reason, self._failed_writes = None, 0
            self._on_reachable()
        result = SendResult.all_succeeded(batch)
        result.details.update(
            {"segment": name.path, "wire_bytes": str(len(data)), "wire_bytes_per_msg": f"{len(data) / len(batch):.1f}"}
        )
        return result

    async def _encode(self, batch: Sequence[QueuedMessage]) -> bytes:
        """The segment of ``batch`` in this transport's codec, with the lane's usable dictionary (zstd in a worker
        thread); its lines sampled for the dictionary, whose training starts when the sample calls for it."""
        text = batch_text(batch, hub_id=self.hub_id, lane=self.lane)
        ld = self.dictionary
        usable = ld.usable_at(self.dictionary_side) if ld is not None else None
        zdict = usable.data if usable is not None else None
        if self.codec is Codec.ZSTD:
            data = await asyncio.to_thread(
                compress_segment, text, compresslevel=self.compresslevel, codec=self.codec, dictionary=zdict
            )
        else:
            data = compress_segment(text, compresslevel=self.compresslevel, codec=self.codec)
        if ld is not None:
            ld.observe(text)
            if usable is not None:
                ld.record(len(text), len(data))
            if ld.wants_training() and (self._training is None or self._training.done()):
                self._training = asyncio.create_task(ld.train(), name=f"upload-dictionary-train-{self.lane}")
                self._training.add_done_callback(self._trained)
        return data

    def _trained(self, task: asyncio.Task[object]) -> None:
        """A training's end: ``LaneDictionary.train`` logs what it expects to fail (zstd, the timeout); anything
        else (the store refusing to keep it) is logged here, and the lane stays on what it had."""
        if not task.cancelled() and task.exception() is not None:
            log.warning("upload.dictionary_training_failed lane=%s error=%r", self.lane, task.exception())

    async def training_done(self) -> None:
        """Return once a dictionary training in progress has ended (at once when none is): for shutdown, and for
        tests, which wait on this rather than on time."""
        training = self._training
        if training is not None:
            await asyncio.wait([training])

    async def _land_dictionary(self) -> None:
        """Land the lane's dictionary before the first segment this transport writes with it, then make it usable
        (``announced``). A dictionary the store says was landed is landed again once per start (an idempotent
        write: one ``exists`` when it is there), so a landing zone that moved or lost it never holds a segment it
        cannot decode. Raises what the write raises: the batch fails with it."""
        ld = self.dictionary
        current = ld.current if ld is not None else None
        if ld is None or current is None or current.dict_id in self._landed:
            return
        path = dictionary_path(current.dict_id)
        await self._write(functools.partial(self._writer.write_path, path, current.data), len(current.data))
        self._landed.add(current.dict_id)
        self.dictionaries_landed += 1
        log.info("upload.dictionary_landed lane=%s dict_id=%d bytes=%d", self.lane, current.dict_id, len(current.data))
        await ld.announced(current.dict_id, self.dictionary_side)

    def _log_failure(self, segment: str, reason: str, kind: FailureKind, error: str) -> None:
        """A warning when writes start failing or fail for another reason; debug while the reason holds."""
        if not self._failing:
            self._failing_since = self._clock.monotonic()
        self._failed_writes += 1
        if reason == self._failing_reason:
            log.debug(
                "upload.write_failed lane=%s segment=%s reason=%s kind=%s error=%s",
                self.lane,
                segment,
                reason,
                kind,
                error,
            )
            return
        self._failing_reason = reason
        log.warning(
            "upload.failing lane=%s reason=%s kind=%s segment=%s error=%s; the messages wait in the store, "
            "retried (said again when a write lands, or fails for another reason)",
            self.lane,
            reason,
            kind,
            segment,
            error,
        )

    def _failed(self, batch: Sequence[QueuedMessage], kind: FailureKind, error: str) -> SendResult:
        self._failing = True
        self._on_unreachable()
        return SendResult.all_failed(batch, kind, error)

    async def close(self) -> None:
        """Wait (within ``write_timeout_s``) for a write still running, so no thread outlives the transport; a
        dictionary still training is cancelled (its thread ends within the training's own timeout)."""
        training, self._training = self._training, None
        if training is not None and not training.done():
            training.cancel()
            await asyncio.wait([training])  # not ``await training``: its cancellation is not ours to raise
        writing, self._writing = self._writing, None
        if writing is not None and not writing.done():
            with contextlib.suppress(Exception):  # its failure was reported when it timed out
                async with asyncio.timeout(self.write_timeout_s):
                    await writing
