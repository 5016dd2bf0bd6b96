"""The cleanup processor of an endpoint's queues: every ``cleanup_interval_s`` it removes the references that
were delivered (at or before a queue's committed offset) and those whose TTL has passed.

Invariants:
* it reads and changes the store only: never the executor's cursors, retry state or checkpoints (the executor's
  ``cleanup`` calls it and counts the run);
* without ``whole`` (``check_entire_queue_on_cleanup``) a queue is scanned from its head past the checkpoint and
  the first unexpired reference ends the scan: a backlog's head is read, not the backlog;
* the store deletes a body with its last reference; a reference the executor still has in a retry and that is
  removed here is dropped by the executor before the retry (counted here, not there);
* a store failure in a run (a full disk) is logged and the next interval tries again; a closed store ends the
  loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from edgehub.core import Clock, StoreClosedError, StoreError
from edgehub.core.expiry import has_expired
from edgehub.store import RemovalReason, Store

__all__ = ["cleanup_loop", "remove_delivered_and_expired"]

log = logging.getLogger(__name__)


async def cleanup_loop(
    clock: Clock, interval_s: Callable[[], float], cleanup: Callable[[], Awaitable[object]], endpoint_id: str
) -> None:
    """Run ``cleanup`` every ``interval_s()`` on ``clock`` until cancelled or the store is closed (asked each
    time: a deployment update changes it while the loop runs)."""
    while True:
        await clock.sleep(interval_s())
        try:
            await cleanup()
        except StoreClosedError:
            raise
        except StoreError as exc:  # a full disk: try again next interval
            log.warning("executor.cleanup_failed endpoint=%s error=%s", endpoint_id, exc)


async def remove_delivered_and_expired(
    store: Store, endpoint_id: str, now: float, *, whole: bool
) -> dict[RemovalReason, int]:
    """Remove the delivered and (at ``now``) expired references of ``endpoint_id``'s queues once; returns what
    was removed, by reason."""
    removed = {RemovalReason.DELIVERED: 0, RemovalReason.TTL: 0}
    for q in store.queues(endpoint_id):
        removed[RemovalReason.DELIVERED] += await store.remove_delivered(q)
        start = store.checkpoint(q).committed + 1
        chunk = 64  # head-only, the first unexpired reference ends it: read a backlog's head, not 4096 of it
        while True:
            refs = store.references(q, start, chunk)
            expired: list[int] = []
            stop = False
            for r in refs:
                if has_expired(r, now):
                    expired.append(r.offset)
                elif not whole:
                    stop = True
                    break
            if expired:
                removed[RemovalReason.TTL] += await store.remove(q, expired, RemovalReason.TTL)
            if stop or len(refs) < chunk:
                break
            start = refs[-1].offset + 1
            chunk = min(chunk * 4, 4096)
    return removed
