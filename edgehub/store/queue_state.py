"""One sequential queue's state in memory: its offsets, checkpoint, durable end, head hint and held items.

The store keeps one ``QueueState`` per queue, made when the queue is loaded at open or first written to.

Invariants:
* ``next_offset`` only grows; at open it is one past the largest of the last key, the committed offset and the
  highest offset ever removed, so offsets are never reused across restarts;
* ``durable_end`` is the first offset still in ``unwritten`` (handed out, write not finished), or
  ``next_offset`` when none is: a reader that reached it has seen every reference below it that will exist;
* no reference below ``head_hint`` is left in the database (cleanup scans from there);
* ``held`` maps offsets to written items in offset order (items are added in the order their writes finished,
  which is the order their offsets were handed out); ``edgehub.store.held`` accounts for them.
"""

from __future__ import annotations

from edgehub.store.codec import VERSION, CheckpointRecord
from edgehub.store.queues import QueueId
from edgehub.store.records import StoredItem

__all__ = ["QueueState"]


class QueueState:
    __slots__ = ("checkpoint", "durable_end", "head_hint", "held", "id", "name", "next_offset", "unwritten")

    def __init__(self, queue: QueueId, checkpoint: CheckpointRecord | None = None, last_offset: int = -1) -> None:
        self.id = queue
        self.name = queue.name  # made once: QueueId.name formats a string
        self.checkpoint = checkpoint if checkpoint is not None else CheckpointRecord(VERSION)
        cp = self.checkpoint
        self.next_offset = max(last_offset, cp.committed, cp.removed_high) + 1
        self.durable_end = self.next_offset
        # Handed out, write not finished, in hand-out order (a dict as an ordered set).
        self.unwritten: dict[int, None] = {}
        self.head_hint = 0
        self.held: dict[int, StoredItem] = {}

    def hand_out(self) -> int:
        """The next offset, recorded as unwritten until ``settle`` is told its write finished."""
        off = self.next_offset
        self.next_offset = off + 1
        self.unwritten[off] = None
        return off

    def settle(self, offsets: list[int]) -> None:
        """These offsets' write finished (or failed: then they stay holes); move ``durable_end`` up to the
        first offset still in flight."""
        unwritten = self.unwritten
        for off in offsets:
            del unwritten[off]
        self.durable_end = next(iter(unwritten)) if unwritten else self.next_offset
