"""The durable message store: one body per message, one reference per queue, checkpoints, dead letters.

API the hub facade and the executors call (on one event loop, except ``read_durable``: see there)::

    store = open_rocks_store(path, clock=clock, fsync=FsyncPolicy.ALWAYS)  # edgehub.store.rocks; or Store.in_memory()
    receipt = await store.enqueue(message, route_results)   # returns when durable (per the fsync policy)
    outcomes = await store.enqueue_many([(message, route_results), ...], sender=identity_id)  # a group
    outcomes, writes = await store.admit_many(items, sender=..., metadata=...)  # the same in two steps
    items = store.read(queue, from_offset, limit)           # references at or after from_offset, in order
    held, start, more = store.read_start(queue, from_offset, limit)  # the part memory answers (held_in_memory)
    items = held + store.read_durable(queue, start, more)    # the rest from the database (thread-safe)
    await store.commit(queue, offset)                        # checkpoint: everything <= offset is delivered
    await store.remove(queue, offsets, RemovalReason.TTL)    # cleanup; a body goes with its last reference
    await store.remove_delivered(queue)                       # cleanup: everything at or below the checkpoint
    await store.dead_letter(item, reason=..., attempts=..., error=...)
    store.dead_letters(endpoint); await store.requeue_dead_letters(endpoint); await store.purge_dead_letters(endpoint)
    await store.close()

The hub calls ``executor.notify()`` for each routed endpoint after ``enqueue`` returns. Policies
(``default_policy``, ``endpoint_policies``, ``store_quota``) are applied by ``edgehub.store.quotas``;
``usage(endpoint)`` / ``usage(None)`` / ``identity_usage(identity_id)`` and ``removed`` (per ``RemovalReason``)
come from ``edgehub.store.usage``. Metadata: ``get_metadata`` / ``put_metadata`` / ``metadata_items(prefix)``.

``Store`` is the coordinator: it owns the queues (``QueueState`` each), hands out offsets and message keys, and
writes ingest groups; admission, usage accounting, the held-message cache (``edgehub.store.held``), dead
letters, metadata and the maintenance writes are parts of their own. The store stores a message as it is
given: the hub facade stamps it (``edgehub.hub.stamps``); sizes leave the hub's id and time stamps out.

Layout (column families): ``messages`` (u64 message key -> body record listing its references),
one ``q:p<n>:<endpoint>`` per queue (u64 offset -> reference with enqueue time and TTL), ``checkpoints``
(queue name -> committed offset, health, highest removed offset), ``dlq:<endpoint>`` (dead letters),
``meta`` (the counters under ``stats/``, and the hub's metadata).

Ingest is one durable write per group (``GroupCommitter``) on a dedicated ``WriterThread``; maintenance writes
go through ``asyncio.to_thread``.

Invariants:
* offsets of a queue only grow, across restarts (``edgehub.store.queue_state``);
* a message body is deleted in the same write batch that removes its last reference;
* a reference is removed no earlier than the write that commits it (``commit`` removes, in that write, the
  delivered references it holds in memory that are their message's only one; cleanup the rest);
* ``read`` never returns a reference at or below the committed offset;
* ``end_offset`` moves only once a write succeeded, and never past an offset whose write is still in flight.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence

from edgehub.core import (
    Clock,
    IngestRejected,
    Message,
    RouteResult,
    StoreClosedError,
    SystemClock,
)
from edgehub.store.backend import Backend, MemoryBackend
from edgehub.store.codec import (
    VERSION,
    CheckpointRecord,
    decode_checkpoint,
    decode_message,
    decode_ref,
    pack_u64,
    unpack_u64,
)
from edgehub.store.dead_letters import DeadLetters
from edgehub.store.eviction import evict_one
from edgehub.store.held import MAX_BYTES, HeldCache
from edgehub.store.ingest import Ingest, Pending
from edgehub.store.maintenance import Maintenance
from edgehub.store.metadata import Metadata
from edgehub.store.policy import QueuePolicy, StoreQuota
from edgehub.store.queue_state import QueueState
from edgehub.store.queues import QueueId
from edgehub.store.quotas import Quotas, too_large
from edgehub.store.records import (
    CHECKPOINTS,
    DEFAULT_TTL_S,
    MESSAGES,
    META,
    Checkpoint,
    DeadLetter,
    EnqueueReceipt,
    FsyncPolicy,
    Reference,
    RemovalReason,
    StoredItem,
    charged_size,
)
from edgehub.store.usage import OWNER, STORE_WIDE, Usage, UsageBook, group_usage, owner_of

__all__ = ["CHECKPOINTS", "MESSAGES", "Store"]  # the families for tools (edgehub.runtime.cli.store)

log = logging.getLogger(__name__)


class Store:
    """See the module docstring. Use it from one event loop; only ``read_durable`` may run in another thread."""

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
        held_max_bytes: int = MAX_BYTES,
    ) -> None:
        if fsync_interval_ms < 0:
            raise ValueError("fsync_interval_ms must be >= 0")
        self._b = backend
        self._clock: Clock = clock or SystemClock()
        fsync = FsyncPolicy(fsync)
        for fam in (MESSAGES, CHECKPOINTS, META):
            self._b.ensure_family(fam)
        self._queues: dict[QueueId, QueueState] = {}
        for name in self._b.families():
            if QueueId.is_queue_name(name):
                self._load_queue(QueueId.parse(name))
        self._closed = False
        self._usage = UsageBook(self._b)
        self.removed = self._usage.removed
        self._held = HeldCache(max_bytes=held_max_bytes)
        self._ingest = Ingest(
            self._b,
            self._queues,
            self._open_queue,
            self._usage,
            self._held,
            self._clock,
            fsync=fsync,
            fsync_interval_ms=fsync_interval_ms,
            max_group=max_group,
            default_ttl_s=float(default_ttl_s),
        )
        self._maint = Maintenance(self._b, self._usage, self._held, sync=fsync is not FsyncPolicy.NONE)
        self._fsync = fsync
        self._quotas = Quotas(
            self._usage,
            self._clock,
            functools.partial(evict_one, self),
            default_policy=default_policy,
            endpoint_policies=endpoint_policies,
            store_quota=store_quota,
        )
        self._dead = DeadLetters(self._b, self._maint, self._held, self._clock, self._queues, self._open_queue)
        self._meta = Metadata(self._b, self._maint)

    @classmethod
    def in_memory(cls, **settings: object) -> Store:
        return cls(MemoryBackend(), **settings)  # type: ignore[arg-type]

    @property
    def default_ttl_s(self) -> float:
        """The TTL of a reference whose route sets none."""
        return self._ingest.default_ttl_s

    @default_ttl_s.setter
    def default_ttl_s(self, ttl_s: float) -> None:
        self._ingest.default_ttl_s = float(ttl_s)

    @property
    def discarded_incoming(self) -> int:
        """Messages accepted with a reference dropped by discardIncoming."""
        return self._ingest.discarded_incoming

    @property
    def groups_written(self) -> int:
        return self._ingest.groups_written

    @property
    def clock(self) -> Clock:
        """The clock the store times references and its waits with."""
        return self._clock

    # -- policies and usage -------------------------------------------------------------------------------
    @property
    def default_policy(self) -> QueuePolicy:
        return self._quotas.default_policy

    @default_policy.setter
    def default_policy(self, policy: QueuePolicy) -> None:
        self._quotas.default_policy = policy

    def set_fsync(self, fsync: FsyncPolicy, fsync_interval_ms: int = 10) -> None:
        """Change the fsync policy while running (a deployment update): group writes from the next one on, and
        maintenance writes (syncing unless ``none``)."""
        if fsync_interval_ms < 0:
            raise ValueError("fsync_interval_ms must be >= 0")
        fsync = FsyncPolicy(fsync)
        self._ingest.set_fsync(fsync, fsync_interval_ms)
        self._maint.set_sync(fsync is not FsyncPolicy.NONE)
        self._fsync = fsync

    @property
    def fsync(self) -> FsyncPolicy:
        return self._fsync

    @property
    def endpoint_policies(self) -> dict[str, QueuePolicy]:
        return self._quotas.endpoint_policies

    @property
    def store_quota(self) -> StoreQuota:
        return self._quotas.store_quota

    @store_quota.setter
    def store_quota(self, quota: StoreQuota) -> None:
        self._quotas.store_quota = quota

    def policy(self, endpoint: str) -> QueuePolicy:
        return self._quotas.policy(endpoint)

    def largest_message_size_bytes(self) -> int:
        """The largest message any endpoint's policy takes, as the policies are now (``Quotas``): what the
        protocol heads bound their reads by (``edgehub.core.message_size.read_bound_bytes``)."""
        return self._quotas.largest_message_size_bytes()

    def usage(self, endpoint: str | None = None) -> tuple[int, int]:
        """(messages, bytes) held for ``endpoint`` (None: the whole store), writes in flight included."""
        return self._usage.usage(STORE_WIDE if endpoint is None else endpoint)

    def ingested(self, endpoint: str | None = None, *, identity_id: str | None = None) -> tuple[int, int]:
        """(messages, bytes) ever stored for ``endpoint`` (None: the store, each message once), or sent by
        ``identity_id``: counters the store keeps anyway, so metrics read them instead of counting per message."""
        key = OWNER + identity_id if identity_id is not None else STORE_WIDE if endpoint is None else endpoint
        return self._usage.ingested(key)

    def identity_usage(self, identity_id: str) -> tuple[int, int]:
        """(messages, bytes) that ``identity_id``'s (``device`` or ``device/module``) messages hold in the store,
        writes in flight included; each message once, however many queues it is in."""
        return self._usage.usage(OWNER + identity_id)

    # -- queues -------------------------------------------------------------------------------------------
    def _load_queue(self, q: QueueId) -> None:
        raw = self._b.get(CHECKPOINTS, q.name.encode())
        cp = decode_checkpoint(raw) if raw is not None else None
        last = self._b.last_key(q.name)
        self._queues[q] = QueueState(q, cp, -1 if last is None else unpack_u64(last))

    def _open_queue(self, q: QueueId) -> QueueState:
        """The queue's state; a new queue's column family is made here, once something goes into it."""
        state = self._queues.get(q)
        if state is None:
            self._b.ensure_family(q.name)
            state = self._queues[q] = QueueState(q)
        return state

    def queues(self, endpoint: str | None = None) -> list[QueueId]:
        """Known queues, highest priority first (per endpoint, when given)."""
        qs = [q for q in self._queues if endpoint is None or q.endpoint == endpoint]
        return sorted(qs, key=lambda q: (q.priority, q.endpoint))

    def next_offset(self, queue: QueueId) -> int:
        """The offset the next enqueue to ``queue`` will get (writes in flight included)."""
        state = self._queues.get(queue)
        return 0 if state is None else state.next_offset

    def end_offset(self, queue: QueueId) -> int:
        """One past the last durable reference of ``queue``: a reader that reached it has seen everything."""
        state = self._queues.get(queue)
        return 0 if state is None else state.durable_end

    def checkpoint(self, queue: QueueId) -> Checkpoint:
        state = self._queues.get(queue)
        cp = state.checkpoint if state is not None else CheckpointRecord(VERSION)
        return Checkpoint(cp.committed, cp.unhealthy_since_s, cp.last_revival_s)

    # -- ingest -------------------------------------------------------------------------------------------
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
        [outcome] = await self.enqueue_many(
            [(message, route_results)], metadata=None if metadata is None else [metadata]
        )
        if isinstance(outcome, IngestRejected):
            raise outcome
        return outcome

    async def enqueue_many(
        self,
        items: Sequence[tuple[Message, Sequence[RouteResult]]],
        *,
        sender: str | None = None,
        metadata: Sequence[Mapping[str, bytes | None] | None] | None = None,
    ) -> list[EnqueueReceipt | IngestRejected]:
        """Store a producer's group of messages (one read of a connection); return when all are durable.

        One receipt or refusal per message, in order: what ``enqueue`` would return or raise for each. A failed
        write raises, as ``enqueue`` does, for the whole group. ``sender`` and ``metadata``: as ``admit_many``
        takes them."""
        outcomes, durable = await self.admit_many(items, sender=sender, metadata=metadata)
        if len(durable) == 1:
            await durable[0]
        elif durable:
            await asyncio.gather(*durable)
        return outcomes

    async def admit_many(
        self,
        items: Sequence[tuple[Message, Sequence[RouteResult]]],
        *,
        sender: str | None = None,
        metadata: Sequence[Mapping[str, bytes | None] | None] | None = None,
        arrived_mono_s: float | None = None,
    ) -> tuple[list[EnqueueReceipt | IngestRejected], list[asyncio.Future[None]]]:
        """The store's one ingest entry (``enqueue_many`` in two steps): admit each message, give it its offsets
        and queue it for the next group write, in order; return each message's outcome (a receipt, or the
        refusal ``enqueue`` would raise) and the futures of the writes queued: once they are all done, every
        accepted message is durable; a failed write fails its futures. Producers that admit their groups one
        after the other get their offsets, and are written, in that order.

        Admission is a stage: a group the admission clears as a whole (``edgehub.store.quotas``) is checked
        only against the default size limit; else each message is checked in turn, and one that must wait for
        room first queues what is pending (so the ones before it are written while it waits) and holds the
        ones after it. The usage the group adds is reserved once for the group (``usage.group_usage``), or
        per message when they are admitted in turn (the next one's check must see it).

        ``sender``: the identity id (``device`` or ``device/module``) that sent the whole group, whose share it
        counts against (default: each message's ``connectionDeviceId``/``connectionModuleId``, as the hub stamps
        them). ``metadata``: per message, the metadata keys to write with it if it is accepted (see
        ``enqueue``). ``arrived_mono_s`` (the store clock's monotonic time): when the group arrived, if it
        waited before it got here; a wait for room ends ``enqueue_timeout_s`` after it (default: now)."""
        self._live()
        quotas, ingest = self._quotas, self._ingest
        sender_key = None if sender is None else OWNER + sender
        sizes = [charged_size(m) for m, _ in items]
        owners = None if sender_key is not None else [owner_of(m.system_properties) for m, _ in items]
        in_turn = quotas.needs_turns() or (
            quotas.store_quota.max_bytes is not None and not quotas.group_fits(sizes, owners, sender_key)
        )
        if in_turn and arrived_mono_s is None:
            arrived_mono_s = self._clock.monotonic()
        limit = quotas.default_policy.max_message_size_bytes
        now = self._clock.time()
        pending = Pending([], {}, [])
        durable: list[asyncio.Future[None]] = []
        out: list[EnqueueReceipt | IngestRejected] = []
        # The stored messages' queues, sizes and senders, for the group's usage (not admitted in turn).
        routed: list[Mapping[QueueId, float]] = []
        stored: list[int] = []
        senders: list[str | None] | None = None if owners is None else []
        n = len(items)
        for (message, route_results), size, owner, meta in zip(
            items,
            sizes,
            owners if owners is not None else [sender_key] * n,
            metadata if metadata is not None else [None] * n,
            strict=True,  # a metadata list of another length is misuse: ValueError
        ):
            queues = ingest.routes(route_results)
            if queues and in_turn:
                per_endpoint: dict[str, int] = {}
                for q in queues:
                    per_endpoint[q.endpoint] = per_endpoint.get(q.endpoint, 0) + 1
                try:
                    if not quotas.has_room(per_endpoint, size, owner):
                        if pending.ops or pending.overflow:
                            durable.append(ingest.enqueue(pending))
                            pending = Pending([], {}, [])
                        dropped = await quotas.make_room(per_endpoint, size, arrived_mono_s, owner)
                        self._live()  # closed while waiting for room
                        now = self._clock.time()  # enqueued once there was room
                        if dropped:
                            pending.overflow += sum(1 for q in queues if q.endpoint in dropped)
                            pending.discarded += 1
                            queues = {q: v for q, v in queues.items() if q.endpoint not in dropped}
                except IngestRejected as exc:
                    out.append(exc)
                    continue
            elif queues and size > limit:
                out.append(too_large(size, limit))
                continue
            if meta:
                pending.ops += Metadata.ops(meta)
            refs: tuple[tuple[QueueId, int], ...] = ()
            if queues:
                refs = ingest.add_message(pending, message, queues, size, now, owner)
                if in_turn:  # reserved at once, so the next message's check sees it
                    self._reserve(
                        pending, group_usage([queues], [size], None if owners is None else [owner]), sender_key
                    )
                else:
                    routed.append(queues)
                    stored.append(size)
                    if senders is not None:
                        senders.append(owner)
            out.append(EnqueueReceipt(message, refs))
        if stored:
            self._reserve(pending, group_usage(routed, stored, senders), sender_key)
        if pending.ops or pending.overflow:
            durable.append(ingest.enqueue(pending))
        return out, durable

    def _reserve(self, pending: Pending, deltas: Usage, sender_key: str | None) -> None:
        """Reserve what ``deltas`` add to the store; a single sender's usage is the store-wide delta."""
        if sender_key is not None and STORE_WIDE in deltas:
            deltas[sender_key] = deltas[STORE_WIDE]
        if deltas:
            self._usage.reserve(pending.deltas, deltas)

    # -- reads --------------------------------------------------------------------------------------------
    @property
    def held_in_memory(self) -> tuple[int, int]:
        """Written references kept in memory with their messages for the executors' reads (so an executor that
        keeps up does not read and decode them back from the database): (messages, estimated bytes). Bounded
        by 16,384 messages and ``held_max_bytes`` (16 MiB by default); released as they are committed or removed."""
        return self._held.count, self._held.bytes

    def read(self, queue: QueueId, from_offset: int, limit: int) -> list[StoredItem]:
        """Up to ``limit`` references at or after ``from_offset`` and after the committed offset, in order."""
        held, start, more = self.read_start(queue, from_offset, limit)
        return held + self.read_durable(queue, start, more) if more else held

    def read_start(self, queue: QueueId, from_offset: int, limit: int) -> tuple[list[StoredItem], int, int]:
        """The part of ``read`` that the event loop does: the references memory holds from the read's start on
        (see ``held_in_memory``), the offset after them, and how many more ``read_durable`` is to read from
        there (0: memory answered, up to ``limit`` or to ``end_offset``). Cheap enough for the event loop,
        where a database read (a decode per message) is not."""
        self._live()
        state = self._queues.get(queue)
        if state is None or limit <= 0:
            return [], from_offset, 0
        start = max(from_offset, state.checkpoint.committed + 1)
        out: list[StoredItem] = []
        held = state.held
        if held:
            # Served from memory while the references are there (written, not removed), one offset after the
            # other; from the first one that is not, from the database.
            get = held.get
            while len(out) < limit:
                item = get(start)
                if item is None:
                    break
                out.append(item)
                start += 1
        return out, start, 0 if start >= state.durable_end else limit - len(out)

    def read_durable(self, queue: QueueId, from_offset: int, limit: int) -> list[StoredItem]:
        """Up to ``limit`` references of ``queue`` at or after ``from_offset``, read and decoded from the
        database, with their messages, in offset order. Does not look at the committed offset or at memory:
        start it where ``read_start`` says.

        Thread-safe: it touches only the backend, never the store's state in memory, and the backends' reads
        may run beside their writes (RocksDB's are; the memory backend's tolerate a concurrent write), so an
        executor runs it in a worker thread while the loop goes on ingesting, committing and removing. A
        reference removed meanwhile is either returned whole or not at all."""
        rows = self._b.scan(queue.name, pack_u64(from_offset), limit)
        refs = [(unpack_u64(k), decode_ref(v)) for k, v in rows]
        bodies = self._b.multi_get(MESSAGES, [pack_u64(r.message_key) for _, r in refs])
        out: list[StoredItem] = []
        for (off, r), body in zip(refs, bodies, strict=True):
            if body is None:
                if self._b.get(queue.name, pack_u64(off)) is not None:  # not removed meanwhile: say so, not crash
                    log.error("store.missing_body queue=%s offset=%d key=%d", queue, off, r.message_key)
                continue
            msg = decode_message(body).to_message()
            out.append(StoredItem(queue, off, msg, r.message_key, r.enqueued_at_s, r.ttl_s, r.size_bytes))
        return out

    def references(self, queue: QueueId, from_offset: int, limit: int) -> list[Reference]:
        """Up to ``limit`` references at or after ``from_offset``, delivered ones included, without bodies."""
        self._live()
        if queue not in self._queues or limit <= 0:
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

    # -- checkpoints and removal --------------------------------------------------------------------------
    async def commit(
        self,
        queue: QueueId,
        offset: int,
        *,
        unhealthy_since_s: float | None = None,
        last_revival_s: float | None = None,
    ) -> None:
        """Record that everything up to ``offset`` is delivered, with the queue's health. Never moves back.

        The references it delivers that memory still holds (``held_in_memory``) and that are their message's only
        reference are removed in the same write, with their bodies, and counted as delivered: cleanup does not
        have to read them back. The rest (held no longer, or sharing a body with another queue) are left to
        ``remove_delivered``."""
        self._live()
        state = self._open_queue(queue)
        await self._maint.commit(state, offset, unhealthy_since_s=unhealthy_since_s, last_revival_s=last_revival_s)

    async def remove(self, queue: QueueId, offsets: Sequence[int], reason: RemovalReason) -> int:
        """Remove these references (missing ones are ignored); count them under ``reason``."""
        self._live()
        state = self._queues.get(queue)
        if state is None or not offsets:
            return 0
        return await self._maint.remove(state, offsets, reason)

    async def remove_delivered(self, queue: QueueId, *, chunk: int = 1024) -> int:
        """Remove every reference of ``queue`` at or below its committed offset (counted as delivered), oldest
        first, one write per ``chunk`` references, so a large backlog does not hold the event loop in one
        piece. The number removed."""
        self._live()
        if chunk < 1:
            raise ValueError("chunk must be at least 1")
        state = self._queues.get(queue)
        return 0 if state is None else await self._maint.remove_delivered(state, chunk)

    def head_hint(self, queue: QueueId) -> int:
        """An offset at or below the queue's first live reference (where its reads start)."""
        return self._queues[queue].head_hint

    # -- dead letters and metadata ------------------------------------------------------------------------
    async def dead_letter(self, item: StoredItem, *, reason: str, attempts: int, error: str | None = None) -> int:
        """Move ``item`` from its queue to its endpoint's dead-letter queue, atomically. Returns the DLQ offset."""
        self._live()
        return await self._dead.move(item, reason=reason, attempts=attempts, error=error)

    def dead_letters(self, endpoint: str, limit: int = 1000) -> list[DeadLetter]:
        """The endpoint's dead letters, oldest first."""
        self._live()
        return self._dead.letters(endpoint, limit)

    async def purge_dead_letters(self, endpoint: str, dlq_offsets: Sequence[int] | None = None) -> int:
        """Delete these dead letters (all when None), with each body whose last reference they were."""
        self._live()
        return await self._dead.purge(endpoint, dlq_offsets)

    async def requeue_dead_letters(self, endpoint: str, dlq_offsets: Sequence[int] | None = None) -> int:
        """Put dead letters back at the tail of their queue, enqueued now with their original TTL."""
        self._live()
        return await self._dead.requeue(endpoint, dlq_offsets)

    def get_metadata(self, key: str) -> bytes | None:
        self._live()
        return self._meta.get(key)

    def metadata_items(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every metadata (key, value) whose key starts with ``prefix`` (e.g. ``identity/``), in key order."""
        self._live()
        return self._meta.items(prefix)

    async def put_metadata(self, key: str, value: bytes | None) -> None:
        """Set (or, with None, delete) a metadata value durably. Keys under ``stats/`` are the store's own."""
        self._live()
        await self._meta.put(key, value)

    async def drop_overwritten_metadata(self) -> None:
        """Make metadata values that were overwritten or deleted leave the files on disk (the identity registry,
        once it has sealed keys that were kept in clear). Runs in a thread: it flushes and compacts."""
        self._live()
        await asyncio.to_thread(self._b.drop_overwritten, META)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def _live(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    async def close(self) -> None:
        """Finish pending writes, then close the backend. Idempotent."""
        if self._closed:
            return
        await self._ingest.close()
        self._closed = True
        self._b.close()
