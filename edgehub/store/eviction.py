"""discardOldest's step, for ``edgehub.store.quotas``: make room by taking one reference out of the store.

From the head of the lowest-priority non-empty queue (of one endpoint, or of any endpoint for the store-wide
quota): the delivered references there if it has any (they only wait for cleanup), else its oldest one, counted
as ``RemovalReason.OVERFLOW``.

It sees the store through ``Evictable``, the five calls it makes: ``Store`` passes itself, and this module never
imports the store (which imports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from edgehub.store.queues import QueueId
from edgehub.store.records import Checkpoint, Reference, RemovalReason

__all__ = ["Evictable", "evict_one"]


class Evictable(Protocol):
    """What an eviction reads and removes (``edgehub.store.store.Store`` is one)."""

    def queues(self, endpoint: str | None = None) -> list[QueueId]: ...

    def references(self, queue: QueueId, from_offset: int, limit: int) -> list[Reference]: ...

    def head_hint(self, queue: QueueId) -> int: ...

    def checkpoint(self, queue: QueueId) -> Checkpoint: ...

    async def remove(self, queue: QueueId, offsets: Sequence[int], reason: RemovalReason) -> int: ...


async def evict_one(store: Evictable, endpoint: str | None) -> bool:
    """One eviction from ``store`` (of ``endpoint``, or of any endpoint); False: nothing to evict."""
    candidates = [q for q in store.queues(endpoint) if store.references(q, 0, 1)]
    if not candidates:
        return False
    victim = max(candidates, key=lambda q: (q.priority, q.endpoint))  # lowest priority
    head = store.references(victim, store.head_hint(victim), 16)
    committed = store.checkpoint(victim).committed
    delivered = [r.offset for r in head if r.offset <= committed]
    if delivered:
        await store.remove(victim, delivered, RemovalReason.DELIVERED)
    else:
        await store.remove(victim, [head[0].offset], RemovalReason.OVERFLOW)
    return True
