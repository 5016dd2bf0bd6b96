"""The store's ingest writes: offsets and message keys handed out, one durable write per group of producers'
pending writes (``GroupCommitter``, on a dedicated ``WriterThread``), and what a written group makes visible.

Invariants:
* a message gets its key and its offsets in ``add_message``, synchronously, so the messages of one producer
  get consecutive offsets in the order it added them;
* a group's references become readable (``QueueState.durable_end``) only once its write returned, and they do
  also when the write failed (holes) or their producer was cancelled while it waited;
* a group's usage reservation is released when its write returned, whether it succeeded or failed; the
  counters it changes are written in its batch (``edgehub.store.usage``);
* written items are offered to the held cache in offset order;
* under ``FsyncPolicy.INTERVAL`` two syncs are at least ``fsync_interval_ms`` apart on the store's clock (the
  first is not delayed), and a group is acknowledged only after the sync that covers it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from edgehub.core import Clock, Message, RouteResult
from edgehub.store.backend import Backend, Op
from edgehub.store.codec import encode_message, encode_ref_fields, pack_u64, unpack_u64
from edgehub.store.group_commit import GroupCommitter, WriterThread
from edgehub.store.held import HeldCache
from edgehub.store.queue_state import QueueState
from edgehub.store.queues import QueueId
from edgehub.store.records import MESSAGES, FsyncPolicy, StoredItem
from edgehub.store.usage import Usage, UsageBook, add

__all__ = ["Ingest", "Pending"]

_ONE_ROUTE_CACHE_SIZE = 256


@dataclass(slots=True)
class Pending:
    """One producer's part of a group: its ops, the usage it adds, its references, the references it dropped."""

    ops: list[Op]
    deltas: Usage
    refs: list[tuple[QueueId, int]]
    overflow: int = 0  # references dropped by discardIncoming, counted when the group is written
    discarded: int = 0  # messages with a reference dropped by discardIncoming
    items: list[StoredItem] = field(default_factory=list)  # what ``read`` returns for refs, once written


class Ingest:
    def __init__(
        self,
        backend: Backend,
        queues: Mapping[QueueId, QueueState],
        open_queue: Callable[[QueueId], QueueState],
        usage: UsageBook,
        held: HeldCache,
        clock: Clock,
        *,
        fsync: FsyncPolicy,
        fsync_interval_ms: int,
        max_group: int,
        default_ttl_s: float,
    ) -> None:
        self._b = backend
        self._queues = queues
        self._open_queue = open_queue
        self._usage = usage
        self._held = held
        self._fsync = fsync
        self._interval_s = fsync_interval_ms / 1000.0
        self._clock = clock
        self._last_sync = -math.inf  # the store clock's monotonic time of the last sync (interval policy)
        self._default_ttl_s = default_ttl_s
        self.discarded_incoming = 0  # messages with a reference dropped by discardIncoming
        last = backend.last_key(MESSAGES)
        self._next_message_key = 0 if last is None else unpack_u64(last) + 1
        # (endpoint, priority) -> its queue id, made once (QueueId() costs ~1 µs)
        self._lanes: dict[tuple[str, int], QueueId] = {}
        # (endpoint, priority, TTL) of a lone route result -> its queues (read-only): see ``routes``
        self._one_route: dict[tuple[str, int, int | None], Mapping[QueueId, float]] = {}
        self._committer: GroupCommitter[Pending] = GroupCommitter(self._write_group, max_group=max_group)
        self._writer = WriterThread("edgehub-store-writer")

    @property
    def default_ttl_s(self) -> float:
        """The TTL of a reference whose route sets none."""
        return self._default_ttl_s

    @default_ttl_s.setter
    def default_ttl_s(self, ttl_s: float) -> None:
        self._default_ttl_s = ttl_s
        self._one_route.clear()  # its TTLs came from the old default

    def set_fsync(self, fsync: FsyncPolicy, fsync_interval_ms: int) -> None:
        """Take a new fsync policy from the next group write on (a group being written keeps its own)."""
        self._fsync = fsync
        self._interval_s = fsync_interval_ms / 1000.0

    @property
    def groups_written(self) -> int:
        return self._committer.groups_written

    def enqueue(self, pending: Pending) -> asyncio.Future[None]:
        """Queue ``pending`` for the next group write; the future is done when it is durable."""
        return self._committer.enqueue(pending)

    async def submit(self, pending: Pending) -> None:
        await self._committer.submit(pending)

    async def close(self) -> None:
        """Finish pending writes, then stop the writer thread."""
        await self._committer.close()
        self._writer.close()

    def routes(self, route_results: Sequence[RouteResult]) -> Mapping[QueueId, float]:
        """queue -> the reference's TTL, one per (endpoint, priority); the first route wins.

        A message routed to one endpoint (the usual case) gets its queues from a cache keyed by the route
        result's value, so that the dict is built once per route, whoever made the result."""
        if len(route_results) == 1:
            rr = route_results[0]
            key = (rr.endpoint, rr.priority, rr.ttl_s)
            queues = self._one_route.get(key)
            if queues is None:
                if len(self._one_route) >= _ONE_ROUTE_CACHE_SIZE:
                    self._one_route.clear()
                queues = self._one_route[key] = self._queues_of(route_results)
            return queues
        return self._queues_of(route_results)

    def _queues_of(self, route_results: Sequence[RouteResult]) -> dict[QueueId, float]:
        lanes = self._lanes
        queues: dict[QueueId, float] = {}
        for rr in route_results:
            lane = (rr.endpoint, rr.priority)
            q = lanes.get(lane)
            if q is None:
                q = lanes[lane] = QueueId(rr.endpoint, rr.priority)
            if q not in queues:
                queues[q] = self._default_ttl_s if rr.ttl_s is None else float(rr.ttl_s)
        return queues

    def add_message(
        self,
        pending: Pending,
        message: Message,
        queues: Mapping[QueueId, float],
        size: int,
        now: float,
        owner: str | None,
    ) -> tuple[tuple[QueueId, int], ...]:
        """Add the (stamped) message's body and references to ``pending``; its refs. ``owner`` (the sender's
        usage key) goes on the held items. The caller reserves the usage they add (``usage.group_usage``).

        Synchronous from offset hand-out to the return, so a group of messages gets consecutive offsets."""
        key = self._next_message_key
        self._next_message_key = key + 1
        ops, items, states = pending.ops, pending.items, self._queues
        sole = len(queues) == 1
        pkey = pack_u64(key)
        # The body before its references, so that a reader of a backend that applies a batch op by op (the
        # memory backend) never meets a reference without its body; encoded once the references are known.
        body_at = len(ops)
        ops.append((MESSAGES, pkey, b""))
        refs: list[tuple[QueueId, int]] = []
        named: list[tuple[str, int]] = []
        for q, ttl in queues.items():
            state = states.get(q) or self._open_queue(q)
            off = state.hand_out()
            refs.append((q, off))
            named.append((state.name, off))
            ops.append((state.name, pack_u64(off), encode_ref_fields(key, now, ttl, size)))
            items.append(StoredItem(q, off, message, key, now, ttl, size, sole, owner))
        ops[body_at] = (MESSAGES, pkey, encode_message(message, named))
        pending.refs += refs
        return tuple(refs)

    async def _write_group(self, group: list[Pending]) -> None:
        ops: list[Op] = []
        overflow = 0
        for p in group:
            ops += p.ops
            overflow += p.overflow
        if len(group) == 1:
            deltas = group[0].deltas  # the one producer's (a Pending is written once, never reused)
        else:
            deltas = {}
            for p in group:
                for k, (c, b) in p.deltas.items():
                    add(deltas, k, c, b)
        tally = self._usage.ingest_tally(deltas, overflow)
        ops += tally.ops
        try:
            await self._write_ops(ops)
            self._held.remember(self._queues, itertools.chain.from_iterable(p.items for p in group))
            self._usage.ingest_written(tally)
            if overflow:
                self.discarded_incoming += sum(p.discarded for p in group)
        finally:
            # Here, not in the producers: a producer cancelled while it waited is still written, and its
            # references must become visible to readers (end_offset) all the same.
            self._settle(itertools.chain.from_iterable(p.refs for p in group))
            self._usage.release(deltas)

    def _settle(self, refs: Iterable[tuple[QueueId, int]]) -> None:
        touched: dict[QueueId, list[int]] = {}
        for q, off in refs:
            offsets = touched.get(q)
            if offsets is None:
                touched[q] = [off]
            else:
                offsets.append(off)
        for q, offsets in touched.items():
            self._queues[q].settle(offsets)

    async def _write_ops(self, ops: list[Op]) -> None:
        backend = self._b
        if self._fsync is FsyncPolicy.INTERVAL:
            await self._writer.run(lambda: backend.write(ops, sync=False))
            wait = self._last_sync + self._interval_s - self._clock.monotonic()
            if wait > 0:
                await self._clock.sleep(wait)
            await self._writer.run(backend.sync_wal)
            self._last_sync = self._clock.monotonic()
        else:
            sync = self._fsync is FsyncPolicy.ALWAYS
            await self._writer.run(lambda: backend.write(ops, sync=sync))
