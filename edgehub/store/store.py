"""The durable message store: one body per message, one reference per queue, checkpoints, dead letters.

API the hub facade and the executors call (all on one event loop)::

    store = open_rocks_store(path, clock=clock, fsync=FsyncPolicy.ALWAYS)  # edgehub.store.rocks; or Store.in_memory()
    receipt = await store.enqueue(message, route_results)   # returns when durable (per the fsync policy)
    items = store.read(queue, from_offset, limit)           # references at or after from_offset, in order
    await store.commit(queue, offset)                        # checkpoint: everything <= offset is delivered
    await store.remove(queue, offsets, RemovalReason.TTL)    # cleanup; a body goes with its last reference
    await store.dead_letter(item, reason=..., attempts=..., error=...)
    store.dead_letters(endpoint); await store.requeue_dead_letters(endpoint); await store.purge_dead_letters(endpoint)
    await store.close()

The hub calls ``executor.notify()`` for each routed endpoint after ``enqueue`` returns. Policies:
``Store(..., default_policy=QueuePolicy(...), endpoint_policies={endpoint: QueuePolicy(...)},
store_quota=StoreQuota(...))``; ``usage(endpoint)`` / ``usage(None)`` give (messages, bytes) held; every removal
is counted in ``removed`` by ``RemovalReason``. Metadata: ``get_metadata`` / ``put_metadata`` /
``metadata_items(prefix)`` (keys under ``stats/`` are the store's own).

``enqueue`` stamps the message before writing it: ``edgeMessageId`` (a fresh UUID) and ``enqueuedTime``
(ISO 8601 UTC, from the store's clock) when the message does not carry them yet; the stamped message is in
the receipt. Stamping here keeps it in the one place every accepted message passes. Sizes for quotas and
``maxMessageSizeBytes`` are measured before stamping (the hub's stamps are not charged). Refusals (quotas, size)
raise ``IngestRejected`` subclasses; a disk failure raises ``StorageIOError`` for that group only.

Layout (column families): ``messages`` (u64 message key -> body record listing its references),
one ``q:p<n>:<endpoint>`` per queue (u64 offset -> reference with enqueue time and TTL), ``checkpoints``
(queue name -> committed offset, health, highest removed offset), ``dlq:<endpoint>`` (dead letters),
``meta`` (usage counters under ``stats/``, written in the same batch as the change they count; the rest for
later issues: identities and the like).

Invariants:
* offsets of a queue only grow, across restarts: the next offset is one past the largest of the last key,
  the committed offset and the highest offset ever removed;
* a message body is deleted in the same write batch that removes its last reference;
* ``read`` never returns a reference at or below the committed offset.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import msgspec

from edgehub.core import (
    Clock,
    Message,
    MessageTooLargeError,
    QuotaExceededError,
    RouteResult,
    StoreClosedError,
    SystemClock,
    SystemProperty,
    utc_from_epoch,
)
from edgehub.store.backend import Backend, MemoryBackend, Op
from edgehub.store.codec import (
    VERSION,
    CheckpointRecord,
    DeadLetterRecord,
    RefRecord,
    decode_checkpoint,
    decode_dead_letter,
    decode_message,
    decode_ref,
    encode_checkpoint,
    encode_dead_letter,
    encode_message,
    encode_ref,
    pack_u64,
    unpack_u64,
)
from edgehub.store.group_commit import GroupCommitter
from edgehub.store.policy import Overflow, QueuePolicy, StoreQuota
from edgehub.store.queues import QueueId, dead_letter_name

__all__ = [
    "Checkpoint",
    "DeadLetter",
    "EnqueueReceipt",
    "FsyncPolicy",
    "Reference",
    "RemovalReason",
    "Store",
    "StoredItem",
]

log = logging.getLogger(__name__)

MESSAGES = "messages"
CHECKPOINTS = "checkpoints"
META = "meta"
DEFAULT_TTL_S = 7200.0


class FsyncPolicy(StrEnum):
    """``always``: a group is synced before anyone is acknowledged. ``interval``: at most one sync every
    ``fsync_interval_ms``; acks still wait for it. ``none``: the WAL is written, not synced: an OS crash or power
    loss can lose acknowledged messages (a process crash cannot)."""

    ALWAYS = "always"
    INTERVAL = "interval"
    NONE = "none"


class RemovalReason(StrEnum):
    DELIVERED = "delivered"
    TTL = "ttl"
    OVERFLOW = "overflow"
    DEADLETTER = "deadletter"


@dataclass(frozen=True, slots=True)
class StoredItem:
    """A reference in a queue, with its message."""

    queue: QueueId
    offset: int
    message: Message
    message_key: int
    enqueued_at_s: float
    ttl_s: float
    size_bytes: int

    @property
    def expires_at_s(self) -> float:
        return self.enqueued_at_s + self.ttl_s


@dataclass(frozen=True, slots=True)
class Reference:
    """A reference without its message: what cleanup and quota accounting look at."""

    offset: int
    message_key: int
    enqueued_at_s: float
    ttl_s: float
    size_bytes: int

    @property
    def expires_at_s(self) -> float:
        return self.enqueued_at_s + self.ttl_s


@dataclass(frozen=True, slots=True)
class EnqueueReceipt:
    """The stamped message and where it went: ``(queue, offset)`` per reference (empty: routed nowhere)."""

    message: Message
    refs: tuple[tuple[QueueId, int], ...]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    committed: int = -1  # -1: nothing delivered yet
    unhealthy_since_s: float | None = None
    last_revival_s: float | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    endpoint: str
    dlq_offset: int
    queue: QueueId
    offset: int
    message: Message
    reason: str
    attempts: int
    error: str | None
    dead_at_s: float
    enqueued_at_s: float
    ttl_s: float


# Usage counters: (count, bytes) per endpoint id, and under STORE_WIDE for the whole store (bodies, once each).
STORE_WIDE = ""
Usage = dict[str, tuple[int, int]]


@dataclass(slots=True)
class _Pending:
    ops: list[Op]
    deltas: Usage


def _add(into: dict[str, tuple[int, int]], key: str, count: int, size: int) -> None:
    c, b = into.get(key, (0, 0))
    into[key] = (c + count, b + size)


_STATS_INGEST = b"stats/i/"  # written only by the group-commit writer
_STATS_MAINT = b"stats/m/"  # written only under the maintenance lock (removal, dead letters, requeue)


class Store:
    """See the module docstring. Not thread safe: use it from one event loop."""

    def __init__(
        self,
        backend: Backend,
        *,
        clock: Clock | None = None,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
        fsync_interval_ms: int = 10,
        default_ttl_s: float = DEFAULT_TTL_S,
        max_group: int = 1024,
        default_policy: QueuePolicy | None = None,
        endpoint_policies: Mapping[str, QueuePolicy] | None = None,
        store_quota: StoreQuota | None = None,
    ) -> None:
        if fsync_interval_ms < 0:
            raise ValueError("fsync_interval_ms must be >= 0")
        self._b = backend
        self._clock: Clock = clock or SystemClock()
        self._fsync = FsyncPolicy(fsync)
        self._interval_s = fsync_interval_ms / 1000.0
        self._last_sync = time.monotonic()
        self.default_ttl_s = float(default_ttl_s)
        for fam in (MESSAGES, CHECKPOINTS, META):
            self._b.ensure_family(fam)
        self._checkpoints: dict[QueueId, CheckpointRecord] = {}
        self._next_offset: dict[QueueId, int] = {}
        self._durable_end: dict[QueueId, int] = {}
        for name in self._b.families():
            if QueueId.is_queue_name(name):
                q = QueueId.parse(name)
                self._load_queue(q)
        last = self._b.last_key(MESSAGES)
        self._next_message_key = 0 if last is None else unpack_u64(last) + 1
        self._dlq_next: dict[str, int] = {}
        self._committer: GroupCommitter[_Pending] = GroupCommitter(self._write_group, max_group=max_group)
        self._remove_lock = asyncio.Lock()
        self.removed: dict[RemovalReason, int] = dict.fromkeys(RemovalReason, 0)
        self._closed = False
        self.default_policy = default_policy or QueuePolicy()
        self.endpoint_policies: dict[str, QueuePolicy] = dict(endpoint_policies or {})
        self.store_quota = store_quota or StoreQuota()
        self._ingest: Usage = self._load_stats(_STATS_INGEST)
        self._maint: Usage = self._load_stats(_STATS_MAINT)
        self._inflight: Usage = {}
        self._space_freed = asyncio.Event()
        self.discarded_incoming = 0

    def _load_stats(self, prefix: bytes) -> Usage:
        out: Usage = {}
        for k, v in self._b.scan(META, prefix, 1 << 30):
            if not k.startswith(prefix):
                break
            c, b = msgspec.msgpack.decode(v, type=tuple[int, int])
            out[k[len(prefix) :].decode()] = (c, b)
        return out

    @staticmethod
    def _stats_ops(prefix: bytes, totals: Usage, keys: Iterable[str]) -> list[Op]:
        return [(META, prefix + k.encode(), msgspec.msgpack.encode(totals[k])) for k in keys]

    def usage(self, endpoint: str | None = None) -> tuple[int, int]:
        """(messages, bytes) held for ``endpoint`` (None: the whole store), writes in flight included."""
        key = STORE_WIDE if endpoint is None else endpoint
        total = (0, 0)
        for d in (self._ingest, self._maint, self._inflight):
            c, b = d.get(key, (0, 0))
            total = (total[0] + c, total[1] + b)
        return total

    @property
    def _quotas_set(self) -> bool:
        policies = [self.default_policy, *self.endpoint_policies.values()]
        return (
            any(p.max_bytes is not None or p.max_messages is not None for p in policies)
            or self.store_quota.max_bytes is not None
            or self.store_quota.max_messages is not None
        )

    def policy(self, endpoint: str) -> QueuePolicy:
        return self.endpoint_policies.get(endpoint, self.default_policy)

    # -- construction -------------------------------------------------------------------------------------
    @classmethod
    def in_memory(cls, **settings: object) -> Store:
        return cls(MemoryBackend(), **settings)  # type: ignore[arg-type]

    def _load_queue(self, q: QueueId) -> None:
        raw = self._b.get(CHECKPOINTS, q.name.encode())
        cp = decode_checkpoint(raw) if raw is not None else CheckpointRecord(VERSION)
        self._checkpoints[q] = cp
        last = self._b.last_key(q.name)
        last_off = -1 if last is None else unpack_u64(last)
        self._next_offset[q] = max(last_off, cp.committed, cp.removed_high) + 1
        self._durable_end[q] = self._next_offset[q]

    def _queue(self, q: QueueId) -> None:
        if q not in self._next_offset:
            self._b.ensure_family(q.name)
            self._checkpoints[q] = CheckpointRecord(VERSION)
            self._next_offset[q] = 0

    # -- ingest -------------------------------------------------------------------------------------------
    def stamp(self, message: Message) -> Message:
        """The message as it will be stored: ``edgeMessageId`` and ``enqueuedTime`` set if absent."""
        updates: dict[str, str] = {}
        sp = message.system_properties
        if SystemProperty.EDGE_MESSAGE_ID not in sp:
            updates[SystemProperty.EDGE_MESSAGE_ID] = uuid.uuid4().hex
        if SystemProperty.ENQUEUED_TIME not in sp:
            updates[SystemProperty.ENQUEUED_TIME] = utc_from_epoch(self._clock.time()).isoformat()
        return message.with_system_properties(**updates) if updates else message

    async def enqueue(
        self,
        message: Message,
        route_results: Sequence[RouteResult],
        *,
        metadata: Mapping[str, bytes | None] | None = None,
    ) -> EnqueueReceipt:
        """Store ``message`` once with a reference in each routed queue; return when durable.

        Raises ``MessageTooLargeError`` over the strictest routed endpoint's ``max_message_size_bytes``, and
        ``QuotaExceededError`` when a quota stays exceeded for ``enqueue_timeout_s`` under ``rejectIncoming``
        (nothing is stored then, for any endpoint). Under ``discardIncoming`` the full endpoint's reference is
        dropped (counted in ``removed[OVERFLOW]``) and the others are stored.

        ``metadata``: metadata keys to set (or, with None, delete) in the same atomic group write as the message,
        so they are durable exactly when it is (the hub's duplicate window). They are written whenever the
        message is accepted, also when it is routed nowhere; never when ``enqueue`` raises."""
        self._live()
        meta_ops = self._metadata_ops(metadata)
        size = message.size_bytes()  # as the producer sent it: the hub's own stamps are not charged to it
        message = self.stamp(message)
        queues: dict[QueueId, RouteResult] = {}
        for rr in route_results:
            queues.setdefault(QueueId(rr.endpoint, rr.priority), rr)
        if not queues:
            await self._accept_unrouted(meta_ops)
            return EnqueueReceipt(message, ())
        endpoints = {q.endpoint for q in queues}
        limit = min(self.policy(e).max_message_size_bytes for e in endpoints)
        if size > limit:
            raise MessageTooLargeError(f"message of {size} bytes is over maxMessageSizeBytes={limit}")
        dropped = await self._make_room(endpoints, queues, size)
        queues = {q: rr for q, rr in queues.items() if q.endpoint not in dropped}
        if not queues:
            await self._accept_unrouted(meta_ops)
            return EnqueueReceipt(message, ())
        now = self._clock.time()
        key = self._next_message_key
        self._next_message_key += 1
        refs: list[tuple[QueueId, int]] = []
        ops: list[Op] = []
        deltas: Usage = {STORE_WIDE: (1, size)}
        for q, rr in queues.items():
            self._queue(q)
            off = self._next_offset[q]
            self._next_offset[q] = off + 1
            refs.append((q, off))
            _add(deltas, q.endpoint, 1, size)
            ttl = float(rr.ttl_s) if rr.ttl_s is not None else self.default_ttl_s
            ops.append((q.name, pack_u64(off), encode_ref(RefRecord(VERSION, key, now, ttl, size))))
        ops.insert(0, (MESSAGES, pack_u64(key), encode_message(message, [(q.name, o) for q, o in refs])))
        ops.extend(meta_ops)
        for k, (c, b) in deltas.items():
            _add(self._inflight, k, c, b)  # reserved now, so concurrent producers see it in their quota check
        await self._committer.submit(_Pending(ops, deltas))
        for q, off in refs:
            if self._durable_end.get(q, 0) <= off:
                self._durable_end[q] = off + 1
        return EnqueueReceipt(message, tuple(refs))

    # Added for the hub's duplicate window (issue 5): metadata carried by an enqueue, in its group write.
    @staticmethod
    def _metadata_ops(metadata: Mapping[str, bytes | None] | None) -> list[Op]:
        if not metadata:
            return []
        if any(k.startswith("stats/") for k in metadata):
            raise ValueError("stats/ keys belong to the store")
        return [(META, k.encode(), v) for k, v in metadata.items()]

    async def _accept_unrouted(self, meta_ops: list[Op]) -> None:
        """A message stored nowhere is still accepted: its metadata goes through the group commit alone."""
        if meta_ops:
            await self._committer.submit(_Pending(meta_ops, {}))

    def _full(self, endpoints: Iterable[str], per_endpoint: Mapping[str, int], size: int) -> list[str | None]:
        """Endpoints whose quota this message would exceed, and None when the store-wide quota would be."""
        full: list[str | None] = []
        for e in endpoints:
            p = self.policy(e)
            c, b = self.usage(e)
            n = per_endpoint[e]
            if (p.max_messages is not None and c + n > p.max_messages) or (
                p.max_bytes is not None and b + n * size > p.max_bytes
            ):
                full.append(e)
        c, b = self.usage(None)
        if not self.store_quota.fits(c + 1, b + size):
            full.append(None)
        return full

    async def _make_room(self, endpoints: set[str], queues: Mapping[QueueId, RouteResult], size: int) -> set[str]:
        """Wait for space, then apply the overflow policy. Returns the endpoints to drop (discardIncoming)."""
        if not self._quotas_set:  # the common case: nothing to check
            return set()
        per_endpoint = {e: sum(1 for q in queues if q.endpoint == e) for e in endpoints}
        full = self._full(endpoints, per_endpoint, size)
        if not full:
            return set()
        timeout = min(self.policy(e).enqueue_timeout_s if e else self.default_policy.enqueue_timeout_s for e in full)
        deadline = self._clock.monotonic() + timeout
        while full and (remaining := deadline - self._clock.monotonic()) > 0:
            self._space_freed.clear()
            sleeper = asyncio.ensure_future(self._clock.sleep(remaining))
            freed = asyncio.ensure_future(self._space_freed.wait())
            try:
                await asyncio.wait({sleeper, freed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                freed.cancel()
            full = self._full(endpoints, per_endpoint, size)
        dropped: set[str] = set()
        for e in full:
            overflow = self.policy(e).overflow if e is not None else self.default_policy.overflow
            where = f"endpoint {e}" if e is not None else "the store"
            if overflow is Overflow.REJECT_INCOMING:
                log.info("store.quota_exceeded where=%s", where)
                raise QuotaExceededError(f"quota of {where} exceeded")
            if overflow is Overflow.DISCARD_INCOMING:
                if e is None:
                    dropped |= endpoints
                else:
                    dropped.add(e)
                continue
            if not await self._evict(e, per_endpoint, size):
                raise QuotaExceededError(f"quota of {where} exceeded and nothing left to discard")
        if dropped:
            self.removed[RemovalReason.OVERFLOW] += sum(per_endpoint[e] for e in dropped)
            self.discarded_incoming += 1
            log.info("store.discarded_incoming endpoints=%s", ",".join(sorted(dropped)))
        return dropped

    async def _evict(self, endpoint: str | None, per_endpoint: Mapping[str, int], size: int) -> bool:
        """discardOldest: remove from the head of the lowest-priority queue first (of ``endpoint``, or of any
        endpoint for the store-wide quota) until the message fits. False if it cannot be made to fit."""
        while True:
            still = [x for x in self._full([endpoint] if endpoint else [], per_endpoint, size) if x == endpoint]
            if not still:
                return True
            candidates = [q for q in self.queues(endpoint) if self.references(q, 0, 1)]
            if not candidates:
                return False
            victim = max(candidates, key=lambda q: (q.priority, q.endpoint))  # lowest priority
            head = self.references(victim, 0, 16)
            committed = self.checkpoint(victim).committed
            delivered = [r.offset for r in head if r.offset <= committed]
            if delivered:
                await self.remove(victim, delivered, RemovalReason.DELIVERED)
            else:
                await self.remove(victim, [head[0].offset], RemovalReason.OVERFLOW)

    async def _write_group(self, group: list[_Pending]) -> None:
        deltas: Usage = {}
        for p in group:
            for k, (c, b) in p.deltas.items():
                _add(deltas, k, c, b)
        totals = dict(self._ingest)
        for k, (c, b) in deltas.items():
            _add(totals, k, c, b)
        ops = [op for p in group for op in p.ops] + self._stats_ops(_STATS_INGEST, totals, deltas)
        try:
            await self._write_ops(ops)
            self._ingest = totals
        finally:
            for k, (c, b) in deltas.items():
                _add(self._inflight, k, -c, -b)
            if deltas:
                self._space_freed.set()  # a failed group frees its reservation

    async def _write_ops(self, ops: list[Op]) -> None:
        if self._fsync is FsyncPolicy.INTERVAL:
            await asyncio.to_thread(self._b.write, ops, sync=False)
            wait = self._last_sync + self._interval_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await asyncio.to_thread(self._b.sync_wal)
            self._last_sync = time.monotonic()
        else:
            await asyncio.to_thread(self._b.write, ops, sync=self._fsync is FsyncPolicy.ALWAYS)

    async def _write(self, ops: list[Op]) -> None:
        await asyncio.to_thread(self._b.write, ops, sync=self._fsync is not FsyncPolicy.NONE)

    # -- queues -------------------------------------------------------------------------------------------
    def queues(self, endpoint: str | None = None) -> list[QueueId]:
        """Known queues, highest priority first (per endpoint, when given)."""
        qs = [q for q in self._next_offset if endpoint is None or q.endpoint == endpoint]
        return sorted(qs, key=lambda q: (q.priority, q.endpoint))

    def next_offset(self, queue: QueueId) -> int:
        """The offset the next enqueue to ``queue`` will get (writes in flight included)."""
        return self._next_offset.get(queue, 0)

    def end_offset(self, queue: QueueId) -> int:
        """One past the last durable reference of ``queue``: a reader that reached it has seen everything."""
        return self._durable_end.get(queue, 0)

    def read(self, queue: QueueId, from_offset: int, limit: int) -> list[StoredItem]:
        """Up to ``limit`` references at or after ``from_offset`` and after the committed offset, in order."""
        self._live()
        if queue not in self._next_offset or limit <= 0:
            return []
        start = max(from_offset, self._checkpoints[queue].committed + 1)
        rows = self._b.scan(queue.name, pack_u64(start), limit)
        refs = [(unpack_u64(k), decode_ref(v)) for k, v in rows]
        bodies = self._b.multi_get(MESSAGES, [pack_u64(r.message_key) for _, r in refs])
        out: list[StoredItem] = []
        for (off, r), body in zip(refs, bodies, strict=True):
            if body is None:  # cannot happen by the invariants; say so rather than crash the pump
                log.error("store.missing_body queue=%s offset=%d key=%d", queue, off, r.message_key)
                continue
            msg = decode_message(body).to_message()
            out.append(StoredItem(queue, off, msg, r.message_key, r.enqueued_at_s, r.ttl_s, r.size_bytes))
        return out

    def references(self, queue: QueueId, from_offset: int, limit: int) -> list[Reference]:
        """Up to ``limit`` references at or after ``from_offset``, delivered ones included, without bodies."""
        self._live()
        if queue not in self._next_offset or limit <= 0:
            return []
        out = []
        for k, v in self._b.scan(queue.name, pack_u64(max(0, from_offset)), limit):
            r = decode_ref(v)
            out.append(Reference(unpack_u64(k), r.message_key, r.enqueued_at_s, r.ttl_s, r.size_bytes))
        return out

    def count(self, queue: QueueId) -> int:
        """References still in the queue (delivered ones not yet cleaned up included). O(n): for tests and tools."""
        n = 0
        start = pack_u64(0)
        while True:
            rows = self._b.scan(queue.name, start, 4096)
            n += len(rows)
            if len(rows) < 4096:
                return n
            start = pack_u64(unpack_u64(rows[-1][0]) + 1)

    def has_message(self, message_key: int) -> bool:
        """Whether the body with this key is still stored (it goes with its last reference)."""
        self._live()
        return self._b.get(MESSAGES, pack_u64(message_key)) is not None

    # -- checkpoints --------------------------------------------------------------------------------------
    def checkpoint(self, queue: QueueId) -> Checkpoint:
        cp = self._checkpoints.get(queue) or CheckpointRecord(VERSION)
        return Checkpoint(cp.committed, cp.unhealthy_since_s, cp.last_revival_s)

    async def commit(
        self,
        queue: QueueId,
        offset: int,
        *,
        unhealthy_since_s: float | None = None,
        last_revival_s: float | None = None,
    ) -> None:
        """Record that everything up to ``offset`` is delivered, with the queue's health. Never moves back."""
        self._live()
        self._queue(queue)
        # Under the maintenance lock: a removal rewrites the same checkpoint record (its removed_high), and two
        # read-modify-writes of one record must not interleave, or a commit could be undone.
        async with self._remove_lock:
            old = self._checkpoints[queue]
            cp = CheckpointRecord(
                VERSION, max(old.committed, offset), unhealthy_since_s, last_revival_s, old.removed_high
            )
            await self._write([(CHECKPOINTS, queue.name.encode(), encode_checkpoint(cp))])
            self._checkpoints[queue] = cp

    # -- removal ------------------------------------------------------------------------------------------
    def _removal_ops(self, refs: Sequence[tuple[str, int, int, int]], deltas: Usage) -> list[Op]:
        """Delete references (family, offset, message key, size), and each body whose last reference this is.
        Adds the usage changes to ``deltas``."""
        ops: list[Op] = []
        gone = {(fam, off) for fam, off, _, _ in refs}
        seen: set[int] = set()
        for fam, off, key, size in refs:
            ops.append((fam, pack_u64(off), None))
            if QueueId.is_queue_name(fam):
                _add(deltas, QueueId.parse(fam).endpoint, -1, -size)
            if key in seen:
                continue
            seen.add(key)
            raw = self._b.get(MESSAGES, pack_u64(key))
            if raw is None:
                continue
            others = [(f, o) for f, o in decode_message(raw).refs if (f, o) not in gone]
            if not any(self._b.get(f, pack_u64(o)) is not None for f, o in others):
                ops.append((MESSAGES, pack_u64(key), None))
                _add(deltas, STORE_WIDE, -1, -size)
        return ops

    async def _maint_write(self, ops: list[Op], deltas: Usage) -> None:
        """Write maintenance ops with the usage counters they change. Call under ``_remove_lock``."""
        totals = dict(self._maint)
        for k, (c, b) in deltas.items():
            _add(totals, k, c, b)
        await self._write(ops + self._stats_ops(_STATS_MAINT, totals, deltas))
        self._maint = totals
        if any(c < 0 for c, _ in deltas.values()):
            self._space_freed.set()

    async def remove(self, queue: QueueId, offsets: Sequence[int], reason: RemovalReason) -> int:
        """Remove these references (missing ones are ignored); count them under ``reason``."""
        self._live()
        if queue not in self._next_offset or not offsets:
            return 0
        async with self._remove_lock:
            raws = self._b.multi_get(queue.name, [pack_u64(o) for o in offsets])
            present = []
            for o, r in zip(offsets, raws, strict=True):
                if r is not None:
                    ref = decode_ref(r)
                    present.append((queue.name, o, ref.message_key, ref.size_bytes))
            if not present:
                return 0
            deltas: Usage = {}
            ops = self._removal_ops(present, deltas)
            old = self._checkpoints[queue]
            high = max(o for _, o, _, _ in present)
            cp = old
            if high > old.removed_high:
                cp = CheckpointRecord(
                    VERSION, old.committed, old.unhealthy_since_s, old.last_revival_s, max(old.removed_high, high)
                )
                ops.append((CHECKPOINTS, queue.name.encode(), encode_checkpoint(cp)))
            await self._maint_write(ops, deltas)
            self._checkpoints[queue] = cp
        self.removed[reason] += len(present)
        log.debug("store.removed queue=%s count=%d reason=%s", queue, len(present), reason)
        return len(present)

    # -- dead letters -------------------------------------------------------------------------------------
    def _dlq_offset(self, endpoint: str) -> int:
        if endpoint not in self._dlq_next:
            last = self._b.last_key(dead_letter_name(endpoint))
            self._dlq_next[endpoint] = 0 if last is None else unpack_u64(last) + 1
        off = self._dlq_next[endpoint]
        self._dlq_next[endpoint] = off + 1
        return off

    async def dead_letter(self, item: StoredItem, *, reason: str, attempts: int, error: str | None = None) -> int:
        """Move ``item`` from its queue to its endpoint's dead-letter queue, atomically. Returns the DLQ offset."""
        self._live()
        fam = dead_letter_name(item.queue.endpoint)
        self._b.ensure_family(fam)
        async with self._remove_lock:
            dlq_off = self._dlq_offset(item.queue.endpoint)
            raw = self._b.get(MESSAGES, pack_u64(item.message_key))
            if raw is None or self._b.get(item.queue.name, pack_u64(item.offset)) is None:
                return -1  # already removed (cleanup got there first)
            rec = decode_message(raw)
            refs = [*rec.refs, (fam, dlq_off)]
            dl = DeadLetterRecord(
                VERSION,
                item.queue.name,
                item.offset,
                item.message_key,
                item.enqueued_at_s,
                item.ttl_s,
                item.size_bytes,
                reason,
                attempts,
                error,
                self._clock.time(),
            )
            ops: list[Op] = [
                (item.queue.name, pack_u64(item.offset), None),
                (MESSAGES, pack_u64(item.message_key), encode_message(rec.to_message(), refs)),
                (fam, pack_u64(dlq_off), encode_dead_letter(dl)),
            ]
            await self._maint_write(ops, {item.queue.endpoint: (-1, -item.size_bytes)})
        self.removed[RemovalReason.DEADLETTER] += 1
        log.info(
            "store.dead_lettered queue=%s offset=%d reason=%s attempts=%d", item.queue, item.offset, reason, attempts
        )
        return dlq_off

    def dead_letters(self, endpoint: str, limit: int = 1000) -> list[DeadLetter]:
        """The endpoint's dead letters, oldest first."""
        self._live()
        out: list[DeadLetter] = []
        for k, v in self._b.scan(dead_letter_name(endpoint), pack_u64(0), limit):
            dl = decode_dead_letter(v)
            body = self._b.get(MESSAGES, pack_u64(dl.message_key))
            if body is None:
                continue
            out.append(
                DeadLetter(
                    endpoint,
                    unpack_u64(k),
                    QueueId.parse(dl.queue),
                    dl.offset,
                    decode_message(body).to_message(),
                    dl.reason,
                    dl.attempts,
                    dl.error,
                    dl.dead_at_s,
                    dl.enqueued_at_s,
                    dl.ttl_s,
                )
            )
        return out

    async def purge_dead_letters(self, endpoint: str, dlq_offsets: Sequence[int] | None = None) -> int:
        """Delete these dead letters (all when None), with each body whose last reference they were."""
        self._live()
        fam = dead_letter_name(endpoint)
        async with self._remove_lock:
            rows = self._b.scan(fam, pack_u64(0), 1 << 30)
            chosen = [(unpack_u64(k), decode_dead_letter(v)) for k, v in rows]
            if dlq_offsets is not None:
                wanted = set(dlq_offsets)
                chosen = [(o, d) for o, d in chosen if o in wanted]
            if not chosen:
                return 0
            deltas: Usage = {}
            ops = self._removal_ops([(fam, o, d.message_key, d.size_bytes) for o, d in chosen], deltas)
            await self._maint_write(ops, deltas)
        return len(chosen)

    async def requeue_dead_letters(self, endpoint: str, dlq_offsets: Sequence[int] | None = None) -> int:
        """Put dead letters back at the tail of their queue, enqueued now with their original TTL."""
        self._live()
        fam = dead_letter_name(endpoint)
        now = self._clock.time()
        async with self._remove_lock:
            rows = self._b.scan(fam, pack_u64(0), 1 << 30)
            chosen = [(unpack_u64(k), decode_dead_letter(v)) for k, v in rows]
            if dlq_offsets is not None:
                wanted = set(dlq_offsets)
                chosen = [(o, d) for o, d in chosen if o in wanted]
            ops: list[Op] = []
            requeued = 0
            placed: list[tuple[QueueId, int]] = []
            deltas: Usage = {}
            bodies: dict[int, tuple[Message, list[tuple[str, int]]]] = {}
            for dlq_off, d in chosen:
                q = QueueId.parse(d.queue)
                self._queue(q)
                off = self._next_offset[q]
                self._next_offset[q] = off + 1
                placed.append((q, off))
                if d.message_key not in bodies:
                    raw = self._b.get(MESSAGES, pack_u64(d.message_key))
                    if raw is None:
                        continue
                    rec = decode_message(raw)
                    bodies[d.message_key] = (rec.to_message(), list(rec.refs))
                bodies[d.message_key][1].append((q.name, off))
                ref = RefRecord(VERSION, d.message_key, now, d.ttl_s, d.size_bytes)
                ops.append((q.name, pack_u64(off), encode_ref(ref)))
                ops.append((fam, pack_u64(dlq_off), None))
                _add(deltas, q.endpoint, 1, d.size_bytes)
                requeued += 1
            for key, (msg, refs) in bodies.items():
                ops.append((MESSAGES, pack_u64(key), encode_message(msg, refs)))
            if ops:
                await self._maint_write(ops, deltas)
            for q, off in placed:
                self._durable_end[q] = max(self._durable_end.get(q, 0), off + 1)
        return requeued

    # -- metadata (identities and the like, for later issues) ----------------------------------------------
    def get_metadata(self, key: str) -> bytes | None:
        self._live()
        return self._b.get(META, key.encode())

    def metadata_items(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every metadata (key, value) whose key starts with ``prefix`` (e.g. ``identity/``), in key order."""
        self._live()
        if not prefix or prefix.startswith("stats/"):
            raise ValueError("give a prefix outside the store's own stats/ keys")
        p = prefix.encode()
        out = []
        for k, v in self._b.scan(META, p, 1 << 30):
            if not k.startswith(p):
                break
            out.append((k.decode(), v))
        return out

    async def put_metadata(self, key: str, value: bytes | None) -> None:
        """Set (or, with None, delete) a metadata value durably. Keys under ``stats/`` are the store's own."""
        self._live()
        if key.startswith("stats/"):
            raise ValueError("stats/ keys belong to the store")
        await self._write([(META, key.encode(), value)])

    # -- lifecycle ----------------------------------------------------------------------------------------
    def _live(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    async def close(self) -> None:
        """Finish pending writes, then close the backend. Idempotent."""
        if self._closed:
            return
        await self._committer.close()
        self._closed = True
        self._b.close()

    @property
    def groups_written(self) -> int:
        return self._committer.groups_written
