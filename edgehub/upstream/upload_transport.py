"""The upload transport: ``$upstream`` as an ``Endpoint`` that lands each batch as one segment file.

``send`` encodes the batch as one segment (``edgehub.upstream.segment``, record format v2), names it after what
it is (``SegmentName``: hub, lane, priority, first and last offset) and hands both to a ``SegmentWriter``; the
write returning is the checkpoint. In production the writer is ``edgehub.upstream.landing.LandingZone``
(fsspec: a local folder by default, s3/abfs/gcs/... through plugins), which makes a write idempotent and
atomically visible; the composition root builds it from the configured URL and passes it here, so this module
does not depend on how or where files land.

Invariants:
* The same batch always gives the same name and the same bytes (gzip ``mtime=0``), so a retried upload of a
  batch whose first write did land never makes a second copy.
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
* A failed write (refused, or timed out) reports the endpoint unreachable (``ReportsUnreachable``): the
  executor parks its queues and sends one probe at a time on its retry schedule instead of every priority
  trying on its own; the first write that succeeds afterwards calls ``on_reachable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from edgehub.core import Clock, FailureKind, SystemClock, TransportError
from edgehub.core.endpoints import UPSTREAM_ENDPOINT, UPSTREAM_LANE
from edgehub.delivery.endpoint import QueuedMessage, SendResult
from edgehub.upstream.bandwidth import TokenBucket
from edgehub.upstream.batching import segment_bytes, segment_name
from edgehub.upstream.segment import SegmentName

__all__ = ["SegmentWriter", "UploadTransport"]

log = logging.getLogger(__name__)

_BURST_BYTES = 65_536  # the uplink bucket's burst: a larger segment goes when it is full, and leaves a debt


class SegmentWriter(Protocol):
    """Where segments land. ``LandingZone`` is the implementation; it raises ``TransportError`` on failure."""

    def write(self, name: SegmentName, data: bytes) -> object:
        """Store ``data`` under ``name``, idempotently; return once it is durable and visible."""
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
        compresslevel: int = 6,
        max_uplink_bps: float | None = None,
        write_timeout_s: float = 120.0,
        clock: Clock | None = None,
    ) -> None:
        if max_batch_messages <= 0:
            raise ValueError("max_batch_messages must be positive")
        if write_timeout_s <= 0:
            raise ValueError("write_timeout_s must be positive")
        SegmentName(hub_id=hub_id, lane=lane, priority=0, first_offset=0, last_offset=0)  # validates the parts
        self._writer = writer
        self.hub_id = hub_id
        self.lane = lane
        self._endpoint_id = endpoint_id
        self._max_batch_messages = max_batch_messages
        self.compresslevel = compresslevel
        self.write_timeout_s = write_timeout_s
        self._bucket = TokenBucket(rate_bps=max_uplink_bps, burst_bytes=_BURST_BYTES, clock=clock or SystemClock())
        self._on_reachable: Callable[[], None] = lambda: None
        self._on_unreachable: Callable[[], None] = lambda: None
        self._failing = False
        self._writing: asyncio.Future[object] | None = None  # the last write's thread, until it returns
        self.segments_written = 0
        self.bytes_written = 0
        self.messages_written = 0

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

    async def _write(self, name: SegmentName, data: bytes) -> None:
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
        await self._bucket.take(len(data))
        writing = asyncio.ensure_future(asyncio.to_thread(self._writer.write, name, data))
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
            name = segment_name(batch, hub_id=self.hub_id, lane=self.lane)
            data = segment_bytes(batch, hub_id=self.hub_id, lane=self.lane, compresslevel=self.compresslevel)
        except ValueError as exc:  # a batch mixing priorities is the executor's bug, not the messages'
            return SendResult.all_failed(batch, FailureKind.PERMANENT, str(exc))
        try:
            await self._write(name, data)
        except TransportError as exc:
            log.info("upload.write_failed lane=%s segment=%s kind=%s error=%s", self.lane, name.path, exc.kind, exc)
            return self._failed(batch, exc.kind, str(exc))
        except Exception as exc:
            log.warning("upload.write_failed lane=%s segment=%s kind=transient error=%r", self.lane, name.path, exc)
            return self._failed(batch, FailureKind.TRANSIENT, repr(exc))
        self.segments_written += 1
        self.bytes_written += len(data)
        self.messages_written += len(batch)
        if self._failing:
            self._failing = False
            self._on_reachable()
        result = SendResult.all_succeeded(batch)
        result.details.update(
            {"segment": name.path, "wire_bytes": str(len(data)), "wire_bytes_per_msg": f"{len(data) / len(batch):.1f}"}
        )
        return result

    def _failed(self, batch: Sequence[QueuedMessage], kind: FailureKind, error: str) -> SendResult:
        self._failing = True
        self._on_unreachable()
        return SendResult.all_failed(batch, kind, error)

    async def close(self) -> None:
        """Wait (within ``write_timeout_s``) for a write still running, so no thread outlives the transport."""
        writing, self._writing = self._writing, None
        if writing is not None and not writing.done():
            with contextlib.suppress(Exception):  # its failure was reported when it timed out
                async with asyncio.timeout(self.write_timeout_s):
                    await writing
