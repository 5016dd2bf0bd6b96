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
* The write runs in a worker thread (fsspec calls block), one at a time (the executor never overlaps sends).
* After one or more failed writes, the first write that succeeds calls ``on_reachable``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from edgehub.core import FailureKind, TransportError
from edgehub.core.endpoints import UPSTREAM_ENDPOINT, UPSTREAM_LANE
from edgehub.delivery.endpoint import QueuedMessage, SendResult
from edgehub.upstream.batching import segment_bytes, segment_name
from edgehub.upstream.segment import SegmentName

__all__ = ["SegmentWriter", "UploadTransport"]

log = logging.getLogger(__name__)


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
    ) -> None:
        if max_batch_messages <= 0:
            raise ValueError("max_batch_messages must be positive")
        SegmentName(hub_id=hub_id, lane=lane, priority=0, first_offset=0, last_offset=0)  # validates the parts
        self._writer = writer
        self.hub_id = hub_id
        self.lane = lane
        self._endpoint_id = endpoint_id
        self._max_batch_messages = max_batch_messages
        self.compresslevel = compresslevel
        self._on_reachable: Callable[[], None] = lambda: None
        self._failing = False
        self.segments_written = 0
        self.bytes_written = 0
        self.messages_written = 0

    @property
    def endpoint_id(self) -> str:
        return self._endpoint_id

    @property
    def max_batch_messages(self) -> int:
        return self._max_batch_messages

    def bind(self, on_reachable: Callable[[], None]) -> None:
        self._on_reachable = on_reachable

    async def send(self, batch: Sequence[QueuedMessage]) -> SendResult:
        if not batch:
            return SendResult()
        try:
            name = segment_name(batch, hub_id=self.hub_id, lane=self.lane)
            data = segment_bytes(batch, hub_id=self.hub_id, lane=self.lane, compresslevel=self.compresslevel)
        except ValueError as exc:  # a batch mixing priorities is the executor's bug, not the messages'
            return SendResult.all_failed(batch, FailureKind.PERMANENT, str(exc))
        try:
            await asyncio.to_thread(self._writer.write, name, data)
        except TransportError as exc:
            self._failing = True
            log.info("upload.write_failed lane=%s segment=%s kind=%s error=%s", self.lane, name.path, exc.kind, exc)
            return SendResult.all_failed(batch, exc.kind, str(exc))
        except Exception as exc:
            self._failing = True
            log.warning("upload.write_failed lane=%s segment=%s kind=transient error=%r", self.lane, name.path, exc)
            return SendResult.all_failed(batch, FailureKind.TRANSIENT, repr(exc))
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

    async def close(self) -> None:
        return None
