"""The durable message store: one body per message, one reference per queue, checkpoints, dead letters.

API the hub facade and the executors call (all on one event loop)::

    store = open_rocks_store(path, clock=clock, fsync=FsyncPolicy.ALWAYS)  # edgehub.store.rocks; or Store.in_memory()
    receipt = await store.enqueue(message, route_results)   # returns when durable (per the fsync policy)
    items = store.read(queue, from_offset, limit)           # references at or after from_offset, in order
    items = store.read_held(queue, from_offset, limit)      # the same from memory, or None (see held_in_memory)
    await store.commit(queue, offset)                        # checkpoint: everything <= offset is delivered
                                                             # (held sole references go in the same write)
    await store.remove(queue, offsets, RemovalReason.TTL)    # cleanup; a body goes with its last reference
    await store.remove_delivered(queue)                       # cleanup: everything at or below the checkpoint
    await store.dead_letter(item, reason=..., attempts=..., error=...)
    store.dead_letters(endpoint); await store.requeue_dead_letters(endpoint); await store.purge_dead_letters(endpoint)
    await store.close()

The hub calls ``executor.notify()`` for each routed endpoint after ``enqueue`` returns. Policies:
``Store(..., default_policy=QueuePolicy(...), endpoint_policies={endpoint: QueuePolicy(...)},
store_quota=StoreQuota(...))``; ``usage(endpoint)`` / ``usage(None)`` give (messages, bytes) held, and
``identity_usage(identity_id)`` what one device or module's messages hold (counted once per message, by its
``connectionDeviceId``/``connectionModuleId``, beside the endpoints' counts and persisted with them, so a
restart, delivery, TTL cleanup, eviction and purge all keep it right); every removal
is counted in ``removed`` by ``RemovalReason``, durably (each count is written in the batch of the removal it
counts, so the counts survive a restart). Metadata: ``get_metadata`` / ``put_metadata`` /
``metadata_items(prefix)`` (keys under ``stats/`` are the store's own).

``enqueue`` stamps the message before writing it: ``edgeMessageId`` (a fresh random UUID, version 4, as 32 hex
digits) and ``enqueuedTime`` (ISO 8601 UTC, from the store's clock, as ``datetime.isoformat`` writes it) when
the message does not carry them yet; the stamped message is in
the receipt. Stamping here keeps it in the one place every accepted message passes. Sizes for quotas and
``maxMessageSizeBytes`` leave these two stamps out (``_charged_size``), also when the hub stamped the message
before handing it over: a message is charged as its producer sent it. Refusals (quotas, size)
raise ``IngestRejected`` subclasses; a disk failure raises ``StorageIOError`` for that group only.

Layout (column families): ``messages`` (u64 message key -> body record listing its references),
one ``q:p<n>:<endpoint>`` per queue (u64 offset -> reference with enqueue time and TTL), ``checkpoints``
(queue name -> committed offset, health, highest removed offset), ``dlq:<endpoint>`` (dead letters),
``meta`` (usage and removal counters under ``stats/``, written in the same batch as the change they count; the
rest for later issues: identities and the like). Each counter key has one writer, so that no two
read-modify-writes of one key interleave: ``stats/i/`` and ``stats/r/i`` the group-commit writer,
``stats/m/`` and ``stats/r/m`` the maintenance writes (under the maintenance lock).

Quotas on the ingest path: with only the store-wide byte quota and the per-identity share set (``edgehub run``'s
defaults), a group is checked as a whole against both (a sum and a dict update per message) and, if it fits,
written as one pending write as without quotas; a group that does not fit is admitted message by message,
which waits for room and applies the overflow policy as any other quota does, except that a message over its
identity's share is refused at once (``QuotaExceededError``): waiting for the same device's backlog to drain
over a thin uplink would only hold its connection.

Ingest is one durable write per group (``GroupCommitter``) on a dedicated ``WriterThread``; maintenance writes
(commit, removal, dead letters) go through ``asyncio.to_thread``, so RocksDB may group them with ingest.

Invariants:
* offsets of a queue only grow, across restarts: the next offset is one past the largest of the last key,
  the committed offset and the highest offset ever removed;
* a message body is deleted in the same write batch that removes its last reference;
* a reference is removed no earlier than the write that commits it (``commit`` removes, in that write, the
  delivered references it holds in memory that are their message's only one; cleanup the rest);
* ``read`` never returns a reference at or below the committed offset;
* ``end_offset`` moves only once a write succeeded, and never past an offset whose write is still in flight
  (so a reader that reached it has seen every reference below it that will ever exist).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from edgehub.core import (
    Clock,
    IngestRejected,
    Message,
    MessageTooLargeError,
    QuotaExceededError,
    RouteResult,
    StoreClosedError,
    SystemClock,
    SystemProperty,
    utc_from_epoch,
)
from edgehub.store.backend import Backend, DeleteTo, MemoryBackend, Op
from edgehub.store.codec import (
    VERSION,
    CheckpointRecord,
    DeadLetterRecord,
    RefRecord,
    decode_checkpoint,
    decode_dead_letter,
    decode_message,
    decode_message_sender_refs,
    decode_ref,
    encode_checkpoint,
    encode_dead_letter,
    encode_message,
    encode_ref,
    encode_ref_fields,
    pack_u64,
    unpack_u64,
)
from edgehub.store.group_commit import GroupCommitter, WriterThread
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
    OVERFLOW = "overflow"  # evicted (discardOldest) or never stored (discardIncoming)
    DEADLETTER = "deadletter"  # moved to the endpoint's dead-letter queue
    PURGED = "purged"  # a dead letter deleted by ``purge_dead_letters``


# A msgspec Struct, not a dataclass: one is built for every message, and its C __init__ takes an eighth of the
# time of a frozen dataclass's (no reference cycles go through it, hence gc=False).
class StoredItem(msgspec.Struct, frozen=True, gc=False):
    """A reference in a queue, with its message. ``sole_reference``: the message was stored for this queue alone
    (its body goes with this reference); False when that is not known (read back from the database)."""

    queue: QueueId
    offset: int
    message: Message
    message_key: int
    enqueued_at_s: float
    ttl_s: float
    size_bytes: int
    sole_reference: bool = False
    owner: str | None = None  # the sender's usage key, known while held (commit uncounts it without a decode)

    @property
    def expires_at_s(self) -> float:
        return self.enqueued_at_s + self.ttl_s


# A msgspec Struct, as above: built for every message.
class Reference(msgspec.Struct, frozen=True, gc=False):
    """A reference without its message: what cleanup and quota accounting look at."""

    offset: int
    message_key: int
    enqueued_at_s: float
    ttl_s: float
    size_bytes: int

    @property
    def expires_at_s(self) -> float:
        return self.enqueued_at_s + self.ttl_s


# A msgspec Struct, as above: built for every message.
class EnqueueReceipt(msgspec.Struct, frozen=True, gc=False):
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


# Usage counters: (count, bytes) per endpoint id, under STORE_WIDE for the whole store (bodies, once each), and
# under _OWNER + identity id for each device's or module's messages (bodies, once each). An endpoint id never
# starts with NUL, so the three never meet, and the identities' counters go wherever the endpoints' go.
STORE_WIDE = ""
_OWNER = "\x00"
Usage = dict[str, tuple[int, int]]
_CONNECTION_DEVICE_ID: str = SystemProperty.CONNECTION_DEVICE_ID.value
_CONNECTION_MODULE_ID: str = SystemProperty.CONNECTION_MODULE_ID.value


def _owner_of(system_properties: Mapping[str, str]) -> str | None:
    """The usage key of the identity that sent a message (None: not sent by one, e.g. a test's message)."""
    return _owner_key(system_properties.get(_CONNECTION_DEVICE_ID), system_properties.get(_CONNECTION_MODULE_ID))


def _owner_key(device: str | None, module: str | None) -> str | None:
    if device is None:
        return None
    return _OWNER + device if module is None else f"{_OWNER}{device}/{module}"


@dataclass(slots=True)
class _Pending:
    """One producer's part of a group: its ops, the usage it adds, its references, the references it dropped."""

    ops: list[Op]
    deltas: Usage
    refs: list[tuple[QueueId, int]]
    overflow: int = 0  # references dropped by discardIncoming, counted when the group is written
    items: list[StoredItem] = field(default_factory=list)  # what ``read`` returns for refs, once written


def _add(into: dict[str, tuple[int, int]], key: str, count: int, size: int) -> None:
    c, b = into.get(key, (0, 0))
    into[key] = (c + count, b + size)


_STATS_INGEST = b"stats/i/"  # written only by the group-commit writer
_STATS_MAINT = b"stats/m/"  # written only under the maintenance lock (removal, dead letters, requeue)
_REMOVED_INGEST = b"stats/r/i"  # removal counts by reason ({reason: n}), group-commit writer (discardIncoming)
_REMOVED_MAINT = b"stats/r/m"  # removal counts by reason ({reason: n}), maintenance writes
_RemovedCounts = dict[str, int]
# Set once the identities' counters cover every message (see ``_count_identities``).
_IDENTITIES_COUNTED = b"stats/identities-counted"
_SCAN_CHUNK = 4096

# The stamps' keys as plain strings: an enum member lookup per message showed in the ingest profile.
_EDGE_MESSAGE_ID: str = SystemProperty.EDGE_MESSAGE_ID.value
_ENQUEUED_TIME: str = SystemProperty.ENQUEUED_TIME.value
_STAMPS = frozenset((_EDGE_MESSAGE_ID, _ENQUEUED_TIME))

# Version-4 UUIDs (RFC 4122) from random bytes: byte 6's high nibble becomes 4, byte 8's top bits 10.
_UUID4_VERSION = bytes((b & 0x0F) | 0x40 for b in range(256))
_UUID4_VARIANT = bytes((b & 0x3F) | 0x80 for b in range(256))
_RANDOM_POOL_BYTES = 16 * 256
_ONE_ROUTE_CACHE_SIZE = 256
# What ``_recent`` may hold: messages, and bytes (``_held_bytes``: each message's charged size, which counts the
# text of its body and properties, plus what its objects take beside that text). A count alone would let 4096
# messages of 256 KiB hold 1 GiB. Measured with tracemalloc (tests/store/test_held_memory.py): ~110 bytes for the
# StoredItem, the Message and its dicts, and ~120 for each property (the key and value objects, the dict slot)
# when its strings are the message's own, as a unique message id or property value is; the constants below keep
# a margin over both. (A flat 1024 bytes a message charged plain telemetry a third over what it takes, and a
# message with ten properties of its own a third under: 2,335 bytes taken, 1,484 charged.)
_RECENT_MAX = 16384
_RECENT_MAX_BYTES = 16 << 20
_RECENT_ITEM_BYTES = 256
_RECENT_PROPERTY_BYTES = 128


def _held_bytes(item: StoredItem) -> int:
    """What holding ``item`` in memory is charged (at least what it takes; see ``_RECENT_MAX_BYTES``)."""
    m = item.message
    entries = len(m.properties) + len(m.system_properties)
    return item.size_bytes + _RECENT_ITEM_BYTES + _RECENT_PROPERTY_BYTES * entries


def _deletions(family: str, keys: list[int]) -> list[Op]:
    """Ops deleting these distinct u64 keys of ``family``: one range deletion when they fill a range of keys
    (a commit's delivered references do, and so do their bodies' keys when one queue is being fed), else one
    deletion per key. The range is checked with ``min`` and ``max``, not the ends of the list: n distinct keys
    with ``max - min + 1 == n`` are exactly that range, in whatever order they come, so a range deletion never
    reaches a key that is not in ``keys``."""
    lo, hi = min(keys), max(keys)
    if hi - lo + 1 == len(keys):
        return [(family, pack_u64(lo), DeleteTo(pack_u64(hi + 1)))]
    return [(family, pack_u64(k), None) for k in keys]


def _charged_size(message: Message) -> int:
    """``message.size_bytes()`` less the store's own stamps (``edgeMessageId``, ``enqueuedTime``): a message is
    charged as its producer sent it, also when the hub stamped it before handing it over (it stamps the groups
    of the protocol heads itself, to copy each message once)."""
    return message.size_bytes(leaving_out=_STAMPS)  # one pass, the stamps skipped


class _Stamper:
    """The stamps ``enqueue`` puts on a message, made cheaply: per message they were ~12 µs of the ~95 µs of
    event-loop work (uuid.uuid4 builds a UUID object; ``datetime.isoformat`` a datetime).

    ``edge_message_id``: a version-4 UUID as 32 hex digits from a pool of ``os.urandom`` bytes (uuid4's own
    source). ``iso_utc(t)``: exactly ``datetime.fromtimestamp(t, UTC).isoformat()`` (same rounding: half to even
    on the microsecond), with the date and time of day formatted once per second."""

    __slots__ = ("_pool", "_pos", "_second", "_second_text")

    def __init__(self) -> None:
        self._pool = ""  # random hex digits, 32 per id
        self._pos = 0
        self._second = math.nan
        self._second_text = ""

    def edge_message_id(self) -> str:
        # One slice of a hex pool whose version and variant bits were set for all its ids at once (two
        # translate calls per pool): a slice per id, not int arithmetic and formatting.
        pos = self._pos
        pool = self._pool
        if pos >= len(pool):
            raw = bytearray(os.urandom(_RANDOM_POOL_BYTES))
            raw[6::16] = raw[6::16].translate(_UUID4_VERSION)
            raw[8::16] = raw[8::16].translate(_UUID4_VARIANT)
            pool = self._pool = raw.hex()
            pos = 0
        self._pos = end = pos + 32
        return pool[pos:end]

    def iso_utc(self, epoch_s: float) -> str:
        frac, whole = math.modf(epoch_s)
        us = round(frac * 1e6)
        if us >= 1_000_000:
            whole, us = whole + 1.0, us - 1_000_000
        elif us < 0:
            whole, us = whole - 1.0, us + 1_000_000
        if whole != self._second:
            self._second_text = utc_from_epoch(whole).isoformat()[:-6]  # whole seconds: no fraction; drop +00:00
            self._second = whole
        return f"{self._second_text}.{us:06d}+00:00" if us else f"{self._second_text}+00:00"


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
        # Offsets handed out whose write has not finished yet, per queue, in the order they were handed out
        # (a dict as an ordered set): ``end_offset`` stops at the first of them.
        self._unwritten: dict[QueueId, dict[int, None]] = {}
        # (endpoint, priority) -> the queue and its name, made once per queue (QueueId() and .name cost ~2 µs)
        self._lanes: dict[tuple[str, int], tuple[QueueId, str]] = {}
        # References written since they were last delivered, with their messages, so that an executor that keeps
        # up reads them without a database read and decode (~8 us a message): added when their group write
        # succeeded, dropped when committed or removed; at most _RECENT_MAX and _RECENT_MAX_BYTES over all
        # queues (past that, new ones are read from the database). Mutated on the event loop only; ``read``
        # (which an executor calls from a worker thread when ``read_held`` says memory does not answer) only
        # looks offsets up one by one.
        self._recent: dict[QueueId, dict[int, StoredItem]] = {}
        self._recent_count = 0
        self._recent_bytes = 0
        # id(route result) -> (that result, the default TTL then, its queues): see ``_queues_for``
        self._one_route: dict[int, tuple[RouteResult, float, Mapping[QueueId, tuple[str, float]]]] = {}
        for name in self._b.families():
            if QueueId.is_queue_name(name):
                q = QueueId.parse(name)
                self._load_queue(q)
        last = self._b.last_key(MESSAGES)
        self._next_message_key = 0 if last is None else unpack_u64(last) + 1
        self._dlq_next: dict[str, int] = {}
        self._committer: GroupCommitter[_Pending] = GroupCommitter(self._write_group, max_group=max_group)
        self._writer = WriterThread("edgehub-store-writer")
        self._stamper = _Stamper()
        self._remove_lock = asyncio.Lock()
        # queue -> no reference below this offset is left (``remove_delivered`` scans from here); memory only
        self._head_hint: dict[QueueId, int] = {}
        self._removed_ingest = self._load_removed(_REMOVED_INGEST)
        self._removed_maint = self._load_removed(_REMOVED_MAINT)
        self.removed: dict[RemovalReason, int] = {
            r: self._removed_ingest.get(r, 0) + self._removed_maint.get(r, 0) for r in RemovalReason
        }
        self._closed = False
        self.default_policy = default_policy or QueuePolicy()
        self.endpoint_policies: dict[str, QueuePolicy] = dict(endpoint_policies or {})
        self.store_quota = store_quota or StoreQuota()
        self._ingest: Usage = self._load_stats(_STATS_INGEST)
        self._maint: Usage = self._load_stats(_STATS_MAINT)
        # Without the marker, the identities' counters may not cover what is stored: a store an older build wrote
        # is counted now; an empty one gets the marker with its first group write (no write at open).
        self._mark_identities = self._b.get(META, _IDENTITIES_COUNTED) is None
        if self._mark_identities and self._b.last_key(MESSAGES) is not None:
            self._count_identities()
            self._mark_identities = False
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

    def _count_identities(self) -> None:
        """Once, at the first open by a build that counts each identity's messages: count what a store written
        before holds per identity (read and decoded message by message, in chunks), into the maintenance
        counters with the marker, in one write. Later opens load the counters as the endpoints' are loaded."""
        counts: Usage = {}
        start = b""
        while True:
            chunk = self._b.scan(MESSAGES, start, _SCAN_CHUNK)
            for _, raw in chunk:
                message = decode_message(raw).to_message()
                owner = _owner_of(message.system_properties)
                if owner is not None:
                    _add(counts, owner, 1, _charged_size(message))
            if len(chunk) < _SCAN_CHUNK:
                break
            start = pack_u64(unpack_u64(chunk[-1][0]) + 1)
        for k, (c, b) in counts.items():
            _add(self._maint, k, c, b)
        self._b.write(
            [*self._stats_ops(_STATS_MAINT, self._maint, counts), (META, _IDENTITIES_COUNTED, b"1")], sync=True
        )
        if counts:
            log.info("store.identities_counted identities=%d", len(counts))

    def _load_removed(self, key: bytes) -> _RemovedCounts:
        raw = self._b.get(META, key)
        return {} if raw is None else msgspec.msgpack.decode(raw, type=_RemovedCounts)

    @staticmethod
    def _removed_op(key: bytes, counts: _RemovedCounts) -> Op:
        return (META, key, msgspec.msgpack.encode(counts))

    @staticmethod
    def _plus(counts: _RemovedCounts, reason: RemovalReason, n: int) -> _RemovedCounts:
        out = dict(counts)
        out[reason] = out.get(reason, 0) + n
        return out

    @property
    def clock(self) -> Clock:
        """The clock the store stamps and times its waits with."""
        return self._clock

    def usage(self, endpoint: str | None = None) -> tuple[int, int]:
        """(messages, bytes) held for ``endpoint`` (None: the whole store), writes in flight included."""
        return self._usage(STORE_WIDE if endpoint is None else endpoint)

    def identity_usage(self, identity_id: str) -> tuple[int, int]:
        """(messages, bytes) that ``identity_id``'s (``device`` or ``device/module``) messages hold in the store,
        writes in flight included; each message once, however many queues it is in."""
        return self._usage(_OWNER + identity_id)

    def _usage(self, key: str) -> tuple[int, int]:
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

    def _lane(self, endpoint: str, priority: int) -> tuple[QueueId, str]:
        q = QueueId(endpoint, priority)
        lane = self._lanes[(endpoint, priority)] = (q, q.name)
        return lane

    def _hand_out(self, q: QueueId) -> int:
        """The next offset of ``q``, recorded as unwritten until ``_written`` says its write finished."""
        off = self._next_offset.get(q)
        if off is None:  # a new queue: its column family is made here, once something goes into it
            self._queue(q)
            off = 0
        self._next_offset[q] = off + 1
        unwritten = self._unwritten.get(q)
        if unwritten is None:
            unwritten = self._unwritten[q] = {}
        unwritten[off] = None
        return off

    def _written(self, refs: Iterable[tuple[QueueId, int]]) -> None:
        """These offsets' write finished (or failed: then they stay holes): move ``end_offset`` up to the first
        offset still in flight."""
        touched: set[QueueId] = set()
        for q, off in refs:
            del self._unwritten[q][off]
            touched.add(q)
        for q in touched:
            unwritten = self._unwritten[q]
            self._durable_end[q] = next(iter(unwritten)) if unwritten else self._next_offset[q]

    # -- ingest -------------------------------------------------------------------------------------------
    def stamp(self, message: Message, now_s: float | None = None, updates: Mapping[str, str] | None = None) -> Message:
        """The message as it will be stored: ``edgeMessageId`` and ``enqueuedTime`` (``now_s``, else the store's
        clock) set if absent. ``updates``: other system properties to set in the same copy (the hub's identity
        stamps), so a message is copied once on its way in, not once per stamper."""
        sp = message.system_properties
        has_id = _EDGE_MESSAGE_ID in sp
        has_time = _ENQUEUED_TIME in sp
        if has_id and has_time and not updates:
            return message
        stamped = dict(sp)
        if updates:
            stamped.update(updates)
        if not has_id:
            stamped[_EDGE_MESSAGE_ID] = self._stamper.edge_message_id()
        if not has_time:
            stamped[_ENQUEUED_TIME] = self._stamper.iso_utc(self._clock.time() if now_s is None else now_s)
        return Message(body=message.body, properties=message.properties, system_properties=stamped)

    def stamp_group(
        self, messages: Sequence[Message], updates: Mapping[str, str], *, drop: str | None = None
    ) -> list[Message]:
        """``stamp`` for a group that arrived together (one read of a connection): one copy per message, with
        ``updates`` set (after removing ``drop``), a fresh ``edgeMessageId`` each, and one ``enqueuedTime`` (the
        store's clock, read once) for all that lack them."""
        enqueued = self._stamper.iso_utc(self._clock.time())
        new_id = self._stamper.edge_message_id
        out: list[Message] = []
        for message in messages:
            sp = message.system_properties
            stamped = dict(sp)
            if drop is not None:
                stamped.pop(drop, None)
            stamped.update(updates)
            if _EDGE_MESSAGE_ID not in sp:
                stamped[_EDGE_MESSAGE_ID] = new_id()
            if _ENQUEUED_TIME not in sp:
                stamped[_ENQUEUED_TIME] = enqueued
            out.append(Message(message.body, message.properties, stamped))
        return out

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
        receipt, durable = await self.admit(message, route_results, metadata=metadata)
        if durable is not None:
            await durable
        return receipt

    async def admit(
        self,
        message: Message,
        route_results: Sequence[RouteResult],
        *,
        metadata: Mapping[str, bytes | None] | None = None,
        arrived_mono_s: float | None = None,
        sender: str | None = None,
    ) -> tuple[EnqueueReceipt, asyncio.Future[None] | None]:
        """``enqueue`` in two steps: return once the message has its offsets (after any wait for room) and is
        queued for the next group write, with the future that is done when it is durable (None: nothing to
        write). Raises what ``enqueue`` raises before that point. Messages admitted one after the other get
        their offsets, and are written, in that order: a producer keeps its order by admitting its messages
        one at a time and then awaiting the futures.

        ``arrived_mono_s`` (the store clock's monotonic time): when the message arrived, if it waited for its
        turn behind others; a wait for room ends ``enqueue_timeout_s`` after it (default: now). ``sender``: the
        identity id (``device`` or ``device/module``) that sent it, whose share it counts against (default: the
        message's ``connectionDeviceId``/``connectionModuleId``, as the hub stamps them)."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        meta_ops = self._metadata_ops(metadata)
        size = _charged_size(message)
        owner = _OWNER + sender if sender is not None else _owner_of(message.system_properties)
        now = self._clock.time()
        queues = self._queues_for(route_results)
        if not queues:
            return EnqueueReceipt(self.stamp(message, now), ()), self._accept_unrouted(meta_ops)
        overflow = 0
        dp = self.default_policy
        if self._policies_may_apply():
            endpoints = {q.endpoint for q in queues}
            limit = min(self.policy(e).max_message_size_bytes for e in endpoints)
            if size > limit:
                raise MessageTooLargeError(f"message of {size} bytes is over maxMessageSizeBytes={limit}")
            dropped = await self._make_room(endpoints, queues, size, arrived_mono_s, owner)
            now = self._clock.time()  # enqueued once there was room (the enqueue timeout may have passed)
            if dropped:
                overflow = sum(1 for q in queues if q.endpoint in dropped)
                queues = {q: v for q, v in queues.items() if q.endpoint not in dropped}
        elif size > dp.max_message_size_bytes:
            limit = dp.max_message_size_bytes
            raise MessageTooLargeError(f"message of {size} bytes is over maxMessageSizeBytes={limit}")
        if self._closed:  # closed while waiting for room
            raise StoreClosedError("the store is closed")
        message = self.stamp(message, now)
        if not queues:  # dropped everywhere (discardIncoming): the write carries only the count
            return EnqueueReceipt(message, ()), self._committer.enqueue(_Pending(meta_ops, {}, [], overflow))
        pending = _Pending(meta_ops, {}, [], overflow)
        deltas: Usage = {}
        refs = self._add_message(pending, message, queues, size, now, deltas, owner)
        if owner is not None:
            deltas[owner] = (1, size)
        self._reserve(pending, deltas)
        return EnqueueReceipt(message, refs), self._committer.enqueue(pending)

    def _queues_for(self, route_results: Sequence[RouteResult]) -> Mapping[QueueId, tuple[str, float]]:
        """queue -> (its name, the reference's TTL), one per (endpoint, priority); the first route wins.

        A message routed to one endpoint (the usual case) gets its result from the router's own ``RouteResult``
        object, the same for every message of that route: its queues are looked up once, kept by the object's
        id with the object itself (so an id reused after the object is gone never matches)."""
        if len(route_results) == 1:
            rr = route_results[0]
            cached = self._one_route.get(id(rr))
            if cached is not None and cached[0] is rr and cached[1] == self.default_ttl_s:
                return cached[2]
            queues = self._queues_of(route_results)
            if len(self._one_route) >= _ONE_ROUTE_CACHE_SIZE:
                self._one_route.clear()
            self._one_route[id(rr)] = (rr, self.default_ttl_s, queues)
            return queues
        return self._queues_of(route_results)

    def _queues_of(self, route_results: Sequence[RouteResult]) -> dict[QueueId, tuple[str, float]]:
        lanes = self._lanes
        queues: dict[QueueId, tuple[str, float]] = {}
        for rr in route_results:
            q, name = lanes.get((rr.endpoint, rr.priority)) or self._lane(rr.endpoint, rr.priority)
            if q not in queues:
                queues[q] = (name, self.default_ttl_s if rr.ttl_s is None else float(rr.ttl_s))
        return queues

    def _needs_turns(self) -> bool:
        """Whether a group must be admitted message by message: some quota other than the store-wide byte quota
        and the identity share (which ``_group_fits`` checks for a group at once), or an endpoint policy."""
        dp = self.default_policy
        return bool(
            self.endpoint_policies
            or dp.max_bytes is not None
            or dp.max_messages is not None
            or self.store_quota.max_messages is not None
        )

    def _group_fits(self, sizes: Sequence[int], owners: Sequence[str | None] | None, sender_key: str | None) -> bool:
        """Whether a whole group fits the store-wide byte quota and each sender's share (every message counted,
        routed or not: erring on the side of the careful path). One sender (``sender_key``), or each message's
        (``owners``)."""
        sq = self.store_quota
        total = sum(sizes)
        if sq.max_bytes is not None and self._usage(STORE_WIDE)[1] + total > sq.max_bytes:
            return False
        share = sq.identity_max_bytes
        if share is None:
            return True
        if owners is None:  # the hub's groups: one sender
            return sender_key is None or self._usage(sender_key)[1] + total <= share
        per_owner: dict[str | None, int] = {}
        for owner, size in zip(owners, sizes, strict=True):
            per_owner[owner] = per_owner.get(owner, 0) + size
        return all(o is None or self._usage(o)[1] + b <= share for o, b in per_owner.items())

    def _check_share(self, owner: str | None, size: int) -> None:
        """Refuse at once a message that would take its identity over its share of the store."""
        share = self.store_quota.identity_max_bytes
        if owner is None or share is None:
            return
        held = self._usage(owner)[1]
        if held + size > share:
            who = owner[len(_OWNER) :]
            log.debug("store.identity_quota_exceeded identity=%s held_bytes=%d share_bytes=%d", who, held, share)
            raise QuotaExceededError(f"identity {who} holds {held} bytes in the store; its share is {share} bytes")

    def _policies_may_apply(self) -> bool:
        """Whether any quota or endpoint policy is set (spelled out: this runs for every message)."""
        dp, sq = self.default_policy, self.store_quota
        return bool(
            self.endpoint_policies
            or dp.max_bytes is not None
            or dp.max_messages is not None
            or sq.max_bytes is not None
            or sq.max_messages is not None
        )

    def _add_message(
        self,
        pending: _Pending,
        message: Message,
        queues: Mapping[QueueId, tuple[str, float]],
        size: int,
        now: float,
        deltas: Usage,
        owner: str | None = None,
    ) -> tuple[tuple[QueueId, int], ...]:
        """Add the (stamped) message's body and references to ``pending``, and the usage they add to ``deltas``
        (``_reserve`` then reserves it); its refs. ``owner`` (the sender's usage key) goes on the held items; the
        caller adds the sender's usage (for a group from one sender, once: it is the group's STORE_WIDE delta).

        Synchronous from offset hand-out to reservation, so a group of messages gets consecutive offsets."""
        key = self._next_message_key
        self._next_message_key = key + 1
        pkey = pack_u64(key)
        ops = pending.ops
        c, b = deltas.get(STORE_WIDE, (0, 0))
        deltas[STORE_WIDE] = (c + 1, b + size)
        if len(queues) == 1:  # one route, the usual case: the loop below without its lists
            for q, (name, ttl) in queues.items():
                off = self._hand_out(q)
                c, b = deltas.get(q.endpoint, (0, 0))
                deltas[q.endpoint] = (c + 1, b + size)
                ops.append((MESSAGES, pkey, encode_message(message, [(name, off)])))
                ops.append((name, pack_u64(off), encode_ref_fields(key, now, ttl, size)))
                pending.items.append(StoredItem(q, off, message, key, now, ttl, size, True, owner))
                ref = (q, off)
                pending.refs.append(ref)
                return (ref,)
        body_at = len(ops)
        ops.append((MESSAGES, pkey, b""))  # the body goes first; encoded below, once refs are known
        refs: list[tuple[QueueId, int]] = []
        named: list[tuple[str, int]] = []
        for q, (name, ttl) in queues.items():
            off = self._hand_out(q)
            refs.append((q, off))
            named.append((name, off))
            c, b = deltas.get(q.endpoint, (0, 0))
            deltas[q.endpoint] = (c + 1, b + size)
            ops.append((name, pack_u64(off), encode_ref_fields(key, now, ttl, size)))
            pending.items.append(StoredItem(q, off, message, key, now, ttl, size, False, owner))
        ops[body_at] = (MESSAGES, pkey, encode_message(message, named))
        pending.refs.extend(refs)
        return tuple(refs)

    def _reserve(self, pending: _Pending, deltas: Usage) -> None:
        """Reserve the usage ``deltas`` of ``pending``, so concurrent producers see it in their quota check."""
        inflight, group_deltas = self._inflight, pending.deltas
        for k, (c, b) in deltas.items():
            ic, ib = inflight.get(k, (0, 0))
            inflight[k] = (ic + c, ib + b)
            gc, gb = group_deltas.get(k, (0, 0))
            group_deltas[k] = (gc + c, gb + b)

    async def enqueue_many(
        self, items: Sequence[tuple[Message, Sequence[RouteResult]]], *, sender: str | None = None
    ) -> list[EnqueueReceipt | IngestRejected]:
        """Store a producer's group of messages (one read of a connection); return when all are durable.

        One receipt or refusal per message, in order: what ``enqueue`` would return or raise for each. When no
        quota or endpoint policy is set (the default), the whole group is one pending write with one future,
        not one per message: the protocol heads hand over everything one socket read brought. With policies,
        each message goes through ``enqueue`` (quota waits and overflow are per message). A failed write
        raises, as ``enqueue`` does, for the whole group. ``sender``: the identity that sent the whole group (the
        hub passes it: one look-up per group, not two per message), as ``admit`` takes it."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        if self._needs_turns():
            return await self._enqueue_in_turn(items, sender)
        sizes = [_charged_size(m) for m, _ in items]
        sender_key = None if sender is None else _OWNER + sender
        owners = None if sender_key is not None else [_owner_of(m.system_properties) for m, _ in items]
        if self.store_quota.max_bytes is not None and not self._group_fits(sizes, owners, sender_key):
            return await self._enqueue_in_turn(items, sender)
        now = self._clock.time()
        limit = self.default_policy.max_message_size_bytes
        pending = _Pending([], {}, [])
        deltas: Usage = {}
        out: list[EnqueueReceipt | IngestRejected] = []
        each_owner = owners if owners is not None else itertools.repeat(sender_key, len(items))
        for (message, route_results), size, owner in zip(items, sizes, each_owner, strict=True):
            queues = self._queues_for(route_results)
            if queues and size > limit:
                out.append(MessageTooLargeError(f"message of {size} bytes is over maxMessageSizeBytes={limit}"))
                continue
            message = self.stamp(message, now)
            if not queues:
                out.append(EnqueueReceipt(message, ()))
                continue
            out.append(EnqueueReceipt(message, self._add_message(pending, message, queues, size, now, deltas, owner)))
            if sender_key is None and owner is not None:
                _add(deltas, owner, 1, size)
        if sender_key is not None and STORE_WIDE in deltas:
            deltas[sender_key] = deltas[STORE_WIDE]  # one sender: its usage is the group's, added once
        self._reserve(pending, deltas)
        if pending.ops:
            await self._committer.submit(pending)
        return out

    async def _enqueue_in_turn(
        self, items: Sequence[tuple[Message, Sequence[RouteResult]]], sender: str | None = None
    ) -> list[EnqueueReceipt | IngestRejected]:
        """``enqueue_many`` with quotas or policies: each message is admitted in turn (it may wait for room, and
        the ones after it wait behind it, so a producer's messages keep their order in every queue), each
        wait bounded from the group's arrival as if they had waited side by side; then all are awaited."""
        arrived = self._clock.monotonic()
        admitted: list[tuple[EnqueueReceipt, asyncio.Future[None] | None] | IngestRejected] = []
        for message, route_results in items:
            try:
                admitted.append(await self.admit(message, route_results, arrived_mono_s=arrived, sender=sender))
            except IngestRejected as exc:
                admitted.append(exc)
        durable = [a[1] for a in admitted if not isinstance(a, IngestRejected) and a[1] is not None]
        if durable:
            await asyncio.gather(*durable)
        return [a if isinstance(a, IngestRejected) else a[0] for a in admitted]

    # Added for the hub's duplicate window (issue 5): metadata carried by an enqueue, in its group write.
    @staticmethod
    def _metadata_ops(metadata: Mapping[str, bytes | None] | None) -> list[Op]:
        if not metadata:
            return []
        if any(k.startswith("stats/") for k in metadata):
            raise ValueError("stats/ keys belong to the store")
        return [(META, k.encode(), v) for k, v in metadata.items()]

    def _accept_unrouted(self, meta_ops: list[Op]) -> asyncio.Future[None] | None:
        """A message stored nowhere is still accepted: its metadata goes through the group commit alone."""
        return self._committer.enqueue(_Pending(meta_ops, {}, [])) if meta_ops else None

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

    async def _make_room(
        self,
        endpoints: set[str],
        queues: Iterable[QueueId],
        size: int,
        arrived_mono_s: float | None = None,
        owner: str | None = None,
    ) -> set[str]:
        """Refuse a message over its sender's share (``owner``); wait for space (until ``enqueue_timeout_s``
        after ``arrived_mono_s``, default now), then apply the overflow policy. Returns the endpoints to drop
        (discardIncoming); the caller counts them when its write is durable."""
        if not self._quotas_set:  # the common case: nothing to check
            return set()
        self._check_share(owner, size)
        per_endpoint = {e: sum(1 for q in queues if q.endpoint == e) for e in endpoints}
        full = self._full(endpoints, per_endpoint, size)
        if not full:
            return set()
        timeout = min(self.policy(e).enqueue_timeout_s if e else self.default_policy.enqueue_timeout_s for e in full)
        deadline = (self._clock.monotonic() if arrived_mono_s is None else arrived_mono_s) + timeout
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
                log.debug("store.quota_exceeded where=%s", where)  # the hub logs the refusal (rate-limited)
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
            head = self.references(victim, self._head_hint.get(victim, 0), 16)
            committed = self.checkpoint(victim).committed
            delivered = [r.offset for r in head if r.offset <= committed]
            if delivered:
                await self.remove(victim, delivered, RemovalReason.DELIVERED)
            else:
                await self.remove(victim, [head[0].offset], RemovalReason.OVERFLOW)

    async def _write_group(self, group: list[_Pending]) -> None:
        deltas: Usage = {}
        ops: list[Op] = []
        overflow = 0
        for p in group:
            ops += p.ops
            overflow += p.overflow
            for k, (c, b) in p.deltas.items():
                dc, db = deltas.get(k, (0, 0))
                deltas[k] = (dc + c, db + b)
        # The changed counters only (one per endpoint, identity and the store): there are as many as identities.
        ingest = self._ingest
        totals: Usage = {}
        for k, (c, b) in deltas.items():
            tc, tb = ingest.get(k, (0, 0))
            totals[k] = (tc + c, tb + b)
        ops += self._stats_ops(_STATS_INGEST, totals, totals)
        marked = self._mark_identities
        if marked:
            ops.append((META, _IDENTITIES_COUNTED, b"1"))
        removed = self._removed_ingest
        if overflow:
            removed = self._plus(removed, RemovalReason.OVERFLOW, overflow)
            ops.append(self._removed_op(_REMOVED_INGEST, removed))
        try:
            await self._write_ops(ops)
            self._remember(group)
            ingest.update(totals)
            if marked:
                self._mark_identities = False
            if overflow:
                self._removed_ingest = removed
                self.removed[RemovalReason.OVERFLOW] += overflow
                self.discarded_incoming += sum(1 for p in group if p.overflow)
        finally:
            # Here, not in the producers: a producer cancelled while it waited is still written, and its
            # references must become visible to readers (end_offset) all the same.
            self._written(ref for p in group for ref in p.refs)
            for k, (c, b) in deltas.items():
                _add(self._inflight, k, -c, -b)
            if deltas:
                self._space_freed.set()  # a failed group frees its reservation

    async def _write_ops(self, ops: list[Op]) -> None:
        backend = self._b
        if self._fsync is FsyncPolicy.INTERVAL:
            await self._writer.run(lambda: backend.write(ops, sync=False))
            wait = self._last_sync + self._interval_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await self._writer.run(backend.sync_wal)
            self._last_sync = time.monotonic()
        else:
            sync = self._fsync is FsyncPolicy.ALWAYS
            await self._writer.run(lambda: backend.write(ops, sync=sync))

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

    @property
    def held_in_memory(self) -> tuple[int, int]:
        """Written references kept in memory with their messages for the executors' reads (so an executor that
        keeps up does not read and decode them back from the database): (messages, estimated bytes). Bounded
        by 16,384 messages and 16 MiB; released as they are committed or removed."""
        return self._recent_count, self._recent_bytes

    def _remember(self, group: list[_Pending]) -> None:
        """Keep the references a group just wrote, with their messages, for ``read`` (see ``_recent``)."""
        count, size = self._recent_count, self._recent_bytes
        if count >= _RECENT_MAX or size >= _RECENT_MAX_BYTES:
            return
        recent = self._recent
        for p in group:
            for item in p.items:
                charge = _held_bytes(item)
                if count >= _RECENT_MAX or size + charge > _RECENT_MAX_BYTES:
                    self._recent_count, self._recent_bytes = count, size
                    return
                held = recent.get(item.queue)
                if held is None:
                    held = recent[item.queue] = {}
                held[item.offset] = item
                count += 1
                size += charge
        self._recent_count, self._recent_bytes = count, size

    def _forget(self, queue: QueueId, offsets: Iterable[int]) -> None:
        held = self._recent.get(queue)
        if held:
            for off in offsets:
                item = held.pop(off, None)
                if item is not None:
                    self._recent_count -= 1
                    self._recent_bytes -= _held_bytes(item)

    def _held_upto(self, queue: QueueId, offset: int) -> list[StoredItem]:
        """The held items of ``queue`` at or below ``offset``, in offset order."""
        held = self._recent.get(queue)
        if not held:
            return []
        return list(itertools.takewhile(lambda it: it.offset <= offset, held.values()))  # kept in offset order

    def read(self, queue: QueueId, from_offset: int, limit: int) -> list[StoredItem]:
        """Up to ``limit`` references at or after ``from_offset`` and after the committed offset, in order."""
        out, start, answered = self._read_held(queue, from_offset, limit)
        if answered:
            return out
        limit -= len(out)
        rows = self._b.scan(queue.name, pack_u64(start), limit)
        refs = [(unpack_u64(k), decode_ref(v)) for k, v in rows]
        bodies = self._b.multi_get(MESSAGES, [pack_u64(r.message_key) for _, r in refs])
        for (off, r), body in zip(refs, bodies, strict=True):
            if body is None:  # cannot happen by the invariants; say so rather than crash the pump
                log.error("store.missing_body queue=%s offset=%d key=%d", queue, off, r.message_key)
                continue
            msg = decode_message(body).to_message()
            out.append(StoredItem(queue, off, msg, r.message_key, r.enqueued_at_s, r.ttl_s, r.size_bytes))
        return out

    def read_held(self, queue: QueueId, from_offset: int, limit: int) -> list[StoredItem] | None:
        """What ``read`` returns, if memory alone answers it (the references are held, see ``held_in_memory``,
        up to ``limit`` or to ``end_offset``); else None: ``read`` would go to the database. Cheap enough for
        the event loop, where a database read (a decode per message) is not."""
        out, _, answered = self._read_held(queue, from_offset, limit)
        return out if answered else None

    def _read_held(self, queue: QueueId, from_offset: int, limit: int) -> tuple[list[StoredItem], int, bool]:
        """The references ``read`` finds in memory, from its start on; the offset after them; whether they are
        all it returns (nothing durable follows them, or ``limit`` is reached)."""
        self._live()
        if queue not in self._next_offset or limit <= 0:
            return [], from_offset, True
        start = max(from_offset, self._checkpoints[queue].committed + 1)
        out: list[StoredItem] = []
        held = self._recent.get(queue)
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
        return out, start, len(out) == limit or start >= self._durable_end.get(queue, 0)

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
        """Record that everything up to ``offset`` is delivered, with the queue's health. Never moves back.

        The references it delivers that memory still holds (``held_in_memory``) and that are their message's only
        reference are removed in the same write, with their bodies, and counted as delivered: cleanup does not
        have to read them back. The rest (held no longer, or sharing a body with another queue) are left to
        ``remove_delivered``."""
        self._live()
        self._queue(queue)
        # Under the maintenance lock: a removal rewrites the same checkpoint record (its removed_high), and two
        # read-modify-writes of one record must not interleave, or a commit could be undone.
        async with self._remove_lock:
            old = self._checkpoints[queue]
            committed = max(old.committed, offset)
            delivered = self._held_upto(queue, committed)
            sole = [it for it in delivered if it.sole_reference]
            high = max(old.removed_high, sole[-1].offset) if sole else old.removed_high
            cp = CheckpointRecord(VERSION, committed, unhealthy_since_s, last_revival_s, high)
            ops: list[Op] = [(CHECKPOINTS, queue.name.encode(), encode_checkpoint(cp))]
            if sole:
                ops += _deletions(queue.name, [it.offset for it in sole])
                ops += _deletions(MESSAGES, [it.message_key for it in sole])
                size = sum(it.size_bytes for it in sole)
                n = len(sole)
                deltas: Usage = {queue.endpoint: (-n, -size), STORE_WIDE: (-n, -size)}
                owners = [it.owner for it in sole]
                if owners.count(owners[0]) == n:  # one sender, the usual case: one delta
                    if owners[0] is not None:
                        deltas[owners[0]] = (-n, -size)
                else:
                    for it in sole:
                        if it.owner is not None:
                            _add(deltas, it.owner, -1, -it.size_bytes)
                await self._maint_write(ops, deltas, (RemovalReason.DELIVERED, n))
                # Removed from the head on: cleanup's scan need not start below them.
                hint = self._head_hint.get(queue, 0)
                for it in sole:
                    if it.offset == hint:
                        hint += 1
                self._head_hint[queue] = hint
            else:
                await self._write(ops)
            self._checkpoints[queue] = cp
            self._forget(queue, [it.offset for it in delivered])

    # -- removal ------------------------------------------------------------------------------------------
    def _removal_ops(self, refs: Sequence[tuple[str, int, int, int]], deltas: Usage) -> list[Op]:
        """Delete references (family, offset, message key, size), and each body whose last reference this is.
        Adds the usage changes to ``deltas``.

        Batched, as cleanup removes thousands at a time on the event loop: the bodies are read in one
        ``multi_get`` and only for their ``refs``, and a body's other references (a message routed to several
        endpoints) in one ``multi_get`` per queue. It was ~29 µs per delivered message (a read and a full decode
        per body); ``python -m bench.store`` prints the figure."""
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
                _add(deltas, QueueId.parse(fam).endpoint, -n, -b)
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
            owners[key] = _owner_key(device, module)
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
                    _add(deltas, owner, -1, -sizes[key])
        if n:
            _add(deltas, STORE_WIDE, -n, -b)
        return ops

    async def _maint_write(
        self, ops: list[Op], deltas: Usage, removed: tuple[RemovalReason, int] | None = None
    ) -> None:
        """Write maintenance ops with the usage counters they change and the removals they count, in one batch.
        Call under ``_remove_lock``."""
        maint = self._maint
        totals: Usage = {}
        for k, (c, b) in deltas.items():
            tc, tb = maint.get(k, (0, 0))
            totals[k] = (tc + c, tb + b)
        ops = ops + self._stats_ops(_STATS_MAINT, totals, totals)
        counts = self._removed_maint
        if removed is not None:
            counts = self._plus(counts, *removed)
            ops.append(self._removed_op(_REMOVED_MAINT, counts))
        await self._write(ops)
        maint.update(totals)
        if removed is not None:
            self._removed_maint = counts
            self.removed[removed[0]] += removed[1]
        if any(c < 0 for c, _ in deltas.values()):
            self._space_freed.set()

    async def remove(self, queue: QueueId, offsets: Sequence[int], reason: RemovalReason) -> int:
        """Remove these references (missing ones are ignored); count them under ``reason``."""
        self._live()
        if queue not in self._next_offset or not offsets:
            return 0
        self._forget(queue, offsets)
        async with self._remove_lock:
            raws = self._b.multi_get(queue.name, [pack_u64(o) for o in offsets])
            present = []
            for o, r in zip(offsets, raws, strict=True):
                if r is not None:
                    ref = decode_ref(r)
                    present.append((queue.name, o, ref.message_key, ref.size_bytes))
            await self._remove_present(queue, present, reason)
        log.debug("store.removed queue=%s count=%d reason=%s", queue, len(present), reason)
        return len(present)

    async def remove_delivered(self, queue: QueueId, *, chunk: int = 1024) -> int:
        """Remove every reference of ``queue`` at or below its committed offset (counted as delivered), oldest
        first, one write per ``chunk`` references, so a backlog of a minute's deliveries does not hold the event
        loop in one piece (~12 ms per chunk of 1024 here). The number removed.

        What ``remove(queue, offsets_up_to_committed, DELIVERED)`` does, in one scan: the references are read
        once, from the lowest offset that may still be there (remembered per queue in memory, so the scan does
        not walk over the tombstones of earlier removals)."""
        self._live()
        if chunk < 1:
            raise ValueError("chunk must be at least 1")
        if queue not in self._next_offset:
            return 0
        total = 0
        while True:
            async with self._remove_lock:
                committed = self._checkpoints[queue].committed
                start = self._head_hint.get(queue, 0)
                name = queue.name
                present = []
                if start <= committed:
                    for k, v in self._b.scan(name, pack_u64(start), min(chunk, committed - start + 1)):
                        off = unpack_u64(k)
                        if off > committed:
                            break
                        ref = decode_ref(v)
                        present.append((name, off, ref.message_key, ref.size_bytes))
                if not present:
                    self._head_hint[queue] = max(start, committed + 1)
                    break
                await self._remove_present(queue, present, RemovalReason.DELIVERED)  # held ones: forgotten at commit
                self._head_hint[queue] = present[-1][1] + 1
            total += len(present)
        log.debug("store.removed queue=%s count=%d reason=%s", queue, total, RemovalReason.DELIVERED)
        return total

    async def _remove_present(
        self, queue: QueueId, present: list[tuple[str, int, int, int]], reason: RemovalReason
    ) -> None:
        """Remove references known to be there (family, offset, message key, size), with their bodies where
        they are the last reference, in one write that counts them. Call under ``_remove_lock``."""
        if not present:
            return
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
        await self._maint_write(ops, deltas, (reason, len(present)))
        self._checkpoints[queue] = cp

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
        self._forget(item.queue, (item.offset,))
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
            await self._maint_write(ops, {item.queue.endpoint: (-1, -item.size_bytes)}, (RemovalReason.DEADLETTER, 1))
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
            await self._maint_write(ops, deltas, (RemovalReason.PURGED, len(chosen)))
        log.info("store.dead_letters_purged endpoint=%s count=%d", endpoint, len(chosen))
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
                if d.message_key not in bodies:
                    raw = self._b.get(MESSAGES, pack_u64(d.message_key))
                    if raw is None:
                        continue
                    rec = decode_message(raw)
                    bodies[d.message_key] = (rec.to_message(), list(rec.refs))
                off = self._hand_out(q)
                placed.append((q, off))
                bodies[d.message_key][1].append((q.name, off))
                ref = RefRecord(VERSION, d.message_key, now, d.ttl_s, d.size_bytes)
                ops.append((q.name, pack_u64(off), encode_ref(ref)))
                ops.append((fam, pack_u64(dlq_off), None))
                _add(deltas, q.endpoint, 1, d.size_bytes)
                requeued += 1
            for key, (msg, refs) in bodies.items():
                ops.append((MESSAGES, pack_u64(key), encode_message(msg, refs)))
            try:
                if ops:
                    await self._maint_write(ops, deltas)
            finally:
                self._written(placed)
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
        self._writer.close()
        self._b.close()

    @property
    def groups_written(self) -> int:
        return self._committer.groups_written
