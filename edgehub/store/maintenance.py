"""The store's maintenance writes (commit, removal, dead letters, requeue, metadata): how references and bodies
are deleted, and the one write path that carries the usage and removal counts they change.

Maintenance writes go through ``asyncio.to_thread`` (not the group-commit writer), so RocksDB may group them
with ingest.

Invariants:
* a body is deleted in the same write batch that removes its last reference;
* every maintenance write that changes usage or removes references carries the changed counters in its batch
  (``edgehub.store.usage``);
* read-modify-writes of one record (a checkpoint, a body's reference list, a counter) are made under ``lock``,
  so that no two interleave;
* a range deletion never reaches a key that is not being deleted (``deletions``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from edgehub.store.backend import Backend, DeleteTo, Op
from edgehub.store.codec import decode_message_sender_refs, pack_u64
from edgehub.store.queues import QueueId
from edgehub.store.records import MESSAGES, RemovalReason
from edgehub.store.usage import STORE_WIDE, Usage, UsageBook, add, owner_key

__all__ = ["Maintenance", "deletions"]


def deletions(family: str, keys: list[int]) -> list[Op]:
    """Ops deleting these distinct u64 keys of ``family``: one range deletion when they fill a range of keys
    (a commit's delivered references do, and so do their bodies' keys when one queue is being fed), else one
    deletion per key. The range is checked with ``min`` and ``max``, not the ends of the list: n distinct keys
    with ``max - min + 1 == n`` are exactly that range, in whatever order they come, so a range deletion never
    reaches a key that is not in ``keys``."""
    lo, hi = min(keys), max(keys)
    if hi - lo + 1 == len(keys):
        return [(family, pack_u64(lo), DeleteTo(pack_u64(hi + 1)))]
    return [(family, pack_u64(k), None) for k in keys]


class Maintenance:
    def __init__(self, backend: Backend, usage: UsageBook, *, sync: bool) -> None:
        self._b = backend
        self._usage = usage
        self._sync = sync
        self.lock = asyncio.Lock()

    async def write_plain(self, ops: list[Op]) -> None:
        """A write that changes no counter."""
        await asyncio.to_thread(self._b.write, ops, sync=self._sync)

    async def write(self, ops: list[Op], deltas: Usage, removed: tuple[RemovalReason, int] | None = None) -> None:
        """Write ops with the usage counters they change and the removals they count, in one batch. Call under
        ``lock``."""
        tally = self._usage.maint_tally(deltas, removed)
        await self.write_plain(ops + tally.ops)
        self._usage.maint_written(tally, freed=any(c < 0 for c, _ in deltas.values()))

    def removal_ops(self, refs: Sequence[tuple[str, int, int, int]], deltas: Usage) -> list[Op]:
        """Delete references (family, offset, message key, size), and each body whose last reference this is.
        Adds the usage changes to ``deltas``.

        Batched, as cleanup removes thousands at a time on the event loop: the bodies are read in one
        ``multi_get`` and only for their ``refs``, and a body's other references (a message routed to several
        endpoints) in one ``multi_get`` per queue."""
        ops: list[Op] = []
        gone = {(fam, off) for fam, off, _, _ in refs}
        per_family: dict[str, tuple[int, int]] = {}
        sizes: dict[int, int] = {}  # message key -> the size charged for it, each key once, in order
        for fam, off, key, size in refs:
            ops.append((fam, pack_u64(off), None))
            n, b = per_family.get(fam, (0, 0))
            per_family[fam] = (n + 1, b + size)
            if key not in sizes:
                sizes[key] = size
        for fam, (n, b) in per_family.items():
            if QueueId.is_queue_name(fam):
                add(deltas, QueueId.parse(fam).endpoint, -n, -b)
        keys = list(sizes)
        raws = self._b.multi_get(MESSAGES, [pack_u64(k) for k in keys])
        doomed: dict[int, bool] = {}  # key -> the body goes (no other reference left)
        owners: dict[int, str | None] = {}  # key -> the identity its message came from
        others: dict[str, list[tuple[int, int]]] = {}  # family -> (offset, key) of the other references
        for key, raw in zip(keys, raws, strict=True):
            if raw is None:
                continue
            doomed[key] = True
            device, module, refs_of = decode_message_sender_refs(raw)
            owners[key] = owner_key(device, module)
            for f, o in refs_of:
                if (f, o) not in gone:
                    others.setdefault(f, []).append((o, key))
        for f, pairs in others.items():
            for (_, key), value in zip(pairs, self._b.multi_get(f, [pack_u64(o) for o, _ in pairs]), strict=True):
                if value is not None:
                    doomed[key] = False
        n = b = 0
        for key, goes in doomed.items():
            if goes:
                ops.append((MESSAGES, pack_u64(key), None))
                n += 1
                b += sizes[key]
                owner = owners[key]
                if owner is not None:
                    add(deltas, owner, -1, -sizes[key])
        if n:
            add(deltas, STORE_WIDE, -n, -b)
        return ops
