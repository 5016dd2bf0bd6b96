"""From queued messages to segment bytes: shared by every transport that sends segments (MQTT batch, upload).

``edge_message_id`` falls back to ``{hub}.{lane}.{priority}.{offset}`` for a message the hub did not stamp
(tests, tools), which is as unique as the queue position. ``segment_bytes`` keeps queue order.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgehub.delivery.endpoint import QueuedMessage
from edgehub.upstream.segment import Codec, SegmentName, compress_segment, record_from_message, segment_text

__all__ = ["batch_text", "edge_message_id", "segment_bytes", "segment_name"]


def edge_message_id(qm: QueuedMessage, *, hub_id: str, lane: str) -> str:
    return qm.message.edge_message_id or f"{hub_id}.{lane}.{qm.priority}.{qm.offset}"


def segment_bytes(
    batch: Sequence[QueuedMessage],
    *,
    hub_id: str,
    lane: str,
    compresslevel: int = 6,
    codec: Codec = Codec.GZIP,
    dictionary: bytes | None = None,
) -> bytes:
    """The segment of ``batch`` (record format v2, JSON lines, one record per message, in queue order; gzip or zstd,
    zstd with ``dictionary`` when given)."""
    text = batch_text(batch, hub_id=hub_id, lane=lane)
    return compress_segment(text, compresslevel=compresslevel, codec=codec, dictionary=dictionary)


def batch_text(batch: Sequence[QueuedMessage], *, hub_id: str, lane: str) -> bytes:
    """The uncompressed segment of ``batch``: its JSON lines."""
    records = (
        record_from_message(
            qm.message,
            hub_id=hub_id,
            edge_message_id=edge_message_id(qm, hub_id=hub_id, lane=lane),
            enqueued_at_s=qm.enqueued_at_s,
            priority=qm.priority,
            ttl_s=qm.ttl_s,
        )
        for qm in batch
    )
    return segment_text(records)


def segment_name(batch: Sequence[QueuedMessage], *, hub_id: str, lane: str, codec: Codec = Codec.GZIP) -> SegmentName:
    """The idempotent name of ``batch``: what it is (hub, lane, priority, first and last offset) and how its file
    is compressed (the suffix)."""
    if not batch:
        raise ValueError("an empty batch has no segment name")
    priorities = {qm.priority for qm in batch}
    if len(priorities) != 1:
        raise ValueError(f"a segment holds one priority, got {sorted(priorities)}")
    return SegmentName(
        hub_id=hub_id,
        lane=lane,
        priority=batch[0].priority,
        first_offset=batch[0].offset,
        last_offset=batch[-1].offset,
        codec=codec,
    )
