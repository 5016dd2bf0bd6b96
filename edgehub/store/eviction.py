"""discardOldest's step, for ``edgehub.store.quotas``: make room by taking one reference out of the store.

From the head of the lowest-priority non-empty queue (of one endpoint, or of any endpoint for the store-wide
quota): the delivered references there if it has any (they only wait for cleanup), else its oldest one, counted
as ``RemovalReason.OVERFLOW``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgehub.store.records import RemovalReason

if TYPE_CHECKING:
    from edgehub.store.store import Store

__all__ = ["evict_one"]


async def evict_one(store: Store, endpoint: str | None) -> bool:
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
