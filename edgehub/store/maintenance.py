"""The store's maintenance writes (commit, removal, dead letters, requeue, metadata): a queue's checkpoint and
the removal of its references, how references and bodies are deleted, and the one write path that carries the
usage and removal counts they change.

Maintenance writes go through ``asyncio.to_thread`` (not the group-commit writer), so RocksDB may group them
with ingest.

Invariants:
* a body is deleted in the same write batch that removes its last reference;
* every maintenance write that changes usage or removes references carries the changed counters in its batch
  (``edgehub.store.usage``);
* read-modify-writes of one record (a checkpoint, a body's reference list, a counter) are made under ``lock``,
  so that no two interleave;
* a range deletion never reaches a key that is not being deleted (``deletions``);
* a checkpoint never moves back; a reference is removed no earlier than the write that commits it;
* the checkpoint record's ``removed_high`` is the highest offset ever removed, so offsets are not reused.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
from collections.abc import Sequence

from edgehub.store.backend import Backend, DeleteTo, Op
from edgehub.store.codec import (
    VERSION,
    CheckpointRecord,
    decode_message_sender_refs,
    decode_ref,
    encode_checkpoint,
    pack_u64,
    unpack_u64,
)
from edgehub.store.held import HeldCache
from edgehub.store.queue_state import QueueState
from edgehub.store.queues import QueueId
from edgehub.store.records import CHECKPOINTS, MESSAGES, RemovalReason, StoredItem
from edgehub.store.usage import STORE_WIDE, Usage, UsageBook, add, owner_key

__all__ = ["Maintenance", "deletions"]

log = logging.getLogger(__name__)


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
    def __init__(self, backend: Backend, usage: UsageBook, held: HeldCache, *, sync: bool) -> None:
        self._b = backend
        self._usage = usage
        self._held = held
        self._sync = sync
        self.lock = asyncio.Lock()

    def set_sync(self, sync: bool) -> None:
        self._sync = sync

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

    # -- checkpoints and removal of a queue's references -----------------------------------------------------
    async def commit(
        self, state: QueueState, offset: int, *, unhealthy_since_s: float | None, last_revival_s: float | None
    ) -> None:
        """Move the queue's checkpoint to ``offset`` (never back), removing in the same write the delivered
        references the held cache has that are their message's only one (see ``Store.commit``)."""
        # Under the lock: a removal rewrites the same checkpoint record (its removed_high), and two
        # read-modify-writes of one record must not interleave, or a commit could be undone.
        async with self.lock:
            old = state.checkpoint
            committed = max(old.committed, offset)
            delivered = self._held.upto(state, committed)
            sole = [it for it in delivered if it.sole_reference]
            high = max(old.removed_high, sole[-1].offset) if sole else old.removed_high
            cp = CheckpointRecord(VERSION, committed, unhealthy_since_s, last_revival_s, high)
            ops: list[Op] = [(CHECKPOINTS, state.name.encode(), encode_checkpoint(cp))]
            if sole:
                ops += deletions(state.name, [it.offset for it in sole])
                ops += deletions(MESSAGES, [it.message_key for it in sole])
                await self.write(ops, _delivered_deltas(state.id.endpoint, sole), (RemovalReason.DELIVERED, len(sole)))
                # Removed from the head on: cleanup's scan need not start below them.
                hint = state.head_hint
                for it in sole:
                    if it.offset == hint:
                        hint += 1
                state.head_hint = hint
            else:
                await self.write_plain(ops)
            state.checkpoint = cp
            self._held.forget(state, [it.offset for it in delivered])

    async def remove(self, state: QueueState, offsets: Sequence[int], reason: RemovalReason) -> int:
        """Remove these references of the queue (missing ones are ignored); count them under ``reason``."""
        self._held.forget(state, offsets)
        async with self.lock:
            raws = self._b.multi_get(state.name, [pack_u64(o) for o in offsets])
            present = []
            for o, r in zip(offsets, raws, strict=True):
                if r is not None:
                    ref = decode_ref(r)
                    present.append((state.name, o, ref.message_key, ref.size_bytes))
            await self._remove_present(state, present, reason)
        log.debug("store.removed queue=%s count=%d reason=%s", state.id, len(present), reason)
        return len(present)

    async def remove_delivered(self, state: QueueState, chunk: int) -> int:
        """Remove the queue's references at or below its committed offset, ``chunk`` per write, scanning from
        its ``head_hint`` (not over the tombstones of earlier removals). The number removed."""
        total = 0
        while True:
            async with self.lock:
                committed = state.checkpoint.committed
                start = state.head_hint
                name = state.name
                present = []
                if start <= committed:
                    for k, v in self._b.scan(name, pack_u64(start), min(chunk, committed - start + 1)):
                        off = unpack_u64(k)
                        if off > committed:
                            break
                        ref = decode_ref(v)
                        present.append((name, off, ref.message_key, ref.size_bytes))
                if not present:
                    state.head_hint = max(start, committed + 1)
                    break
                await self._remove_present(state, present, RemovalReason.DELIVERED)  # held ones: forgotten at commit
                state.head_hint = present[-1][1] + 1
            total += len(present)
        log.debug("store.removed queue=%s count=%d reason=%s", state.id, total, RemovalReason.DELIVERED)
        return total

    async def _remove_present(
        self, state: QueueState, present: list[tuple[str, int, int, int]], reason: RemovalReason
    ) -> None:
        """Remove references known to be there (family, offset, message key, size), with their bodies where
        they are the last reference, in one write that counts them. Call under ``lock``."""
        if not present:
            return
        deltas: Usage = {}
        ops = self.removal_ops(present, deltas)
        old = state.checkpoint
        high = max(o for _, o, _, _ in present)
        cp = old
        if high > old.removed_high:
            cp = CheckpointRecord(VERSION, old.committed, old.unhealthy_since_s, old.last_revival_s, high)
            ops.append((CHECKPOINTS, state.name.encode(), encode_checkpoint(cp)))
        await self.write(ops, deltas, (reason, len(present)))
        state.checkpoint = cp


def _delivered_deltas(endpoint: str, sole: list[StoredItem]) -> Usage:
    """The usage that delivered held items (each its body's only reference) stop taking."""
    size = sum(map(_SIZE, sole))
    n = len(sole)
    deltas: Usage = {endpoint: (-n, -size), STORE_WIDE: (-n, -size)}
    # Per sender, a run at a time: a queue holds its senders' messages in runs (each group write is one
    # sender's), so this is one step per run, not per message, however the senders interleave.
    for owner, run in itertools.groupby(sole, _OWNER):
        if owner is not None:
            items = list(run)
            add(deltas, owner, -len(items), -sum(map(_SIZE, items)))
    return deltas


_OWNER = operator.attrgetter("owner")
_SIZE = operator.attrgetter("size_bytes")
