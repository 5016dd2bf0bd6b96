"""The store's usage accounting: what is held, as (messages, bytes), per endpoint, per sending identity and for
the whole store; and how many references were removed, per ``RemovalReason``.

Keys: an endpoint id; ``STORE_WIDE`` for the whole store (each body once); ``OWNER`` + identity id for one
device's or module's messages (each body once). An endpoint id never starts with NUL, so the three never meet.

Invariants:
* every count is written in the batch of the change it counts (``meta`` family, under ``stats/``), so the counts
  survive a restart exactly as the data does;
* each counter key has one writer, so no two read-modify-writes of one key interleave: ``stats/i/`` and
  ``stats/r/i`` the group-commit writer (``ingest_*``), ``stats/m/`` and ``stats/r/m`` the maintenance writes
  (``maint_*``, under the store's maintenance lock);
* ``usage`` includes what is reserved for writes in flight (``inflight``), so concurrent producers see each
  other in their quota checks; a group's reservation is released when its write finished or failed;
* ``space_freed`` is set whenever held usage may have gone down (admission waits on it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from edgehub.core import SystemProperty
from edgehub.store.backend import Backend, Op
from edgehub.store.codec import decode_message, pack_u64, unpack_u64
from edgehub.store.queues import QueueId
from edgehub.store.records import MESSAGES, META, RemovalReason, charged_size

__all__ = ["OWNER", "STORE_WIDE", "Usage", "UsageBook", "add", "group_usage", "owner_key", "owner_of"]

log = logging.getLogger(__name__)

STORE_WIDE = ""
OWNER = "\x00"
Usage = dict[str, tuple[int, int]]
RemovedCounts = dict[str, int]

_CONNECTION_DEVICE_ID: str = SystemProperty.CONNECTION_DEVICE_ID.value
_CONNECTION_MODULE_ID: str = SystemProperty.CONNECTION_MODULE_ID.value
_STATS_INGEST = b"stats/i/"
_STATS_MAINT = b"stats/m/"
_REMOVED_INGEST = b"stats/r/i"  # {reason: n}: discardIncoming, counted by the group-commit writer
_REMOVED_MAINT = b"stats/r/m"  # {reason: n}: the maintenance writes
# Set once the identities' counters cover every message (see ``_count_identities``).
_IDENTITIES_COUNTED = b"stats/identities-counted"
_SCAN_CHUNK = 4096
_NONE = (0, 0)


def owner_of(system_properties: Mapping[str, str]) -> str | None:
    """The usage key of the identity that sent a message (None: not sent by one, e.g. a test's message)."""
    return owner_key(system_properties.get(_CONNECTION_DEVICE_ID), system_properties.get(_CONNECTION_MODULE_ID))


def owner_key(device: str | None, module: str | None) -> str | None:
    if device is None:
        return None
    return OWNER + device if module is None else f"{OWNER}{device}/{module}"


def add(into: Usage, key: str, count: int, size: int) -> None:
    c, b = into.get(key, (0, 0))
    into[key] = (c + count, b + size)


def group_usage(
    routed: Sequence[Collection[QueueId]], sizes: Sequence[int], owners: Sequence[str | None] | None
) -> Usage:
    """What stored messages add to the usage, counted once for them all: each message once store-wide (and to
    its sender's key, with ``owners``), and to its endpoint once per reference. ``routed``: each message's
    queues; ``sizes``: their charged sizes.

    A group routed alike (one connection's read on one route: the usual case) is counted per endpoint in one
    step, not per message."""
    n = len(sizes)
    if not n:
        return {}
    total = sum(sizes)
    deltas: Usage = {STORE_WIDE: (n, total)}
    first = routed[0]
    if routed.count(first) == n:
        for q in first:
            add(deltas, q.endpoint, n, total)
    else:
        for queues, size in zip(routed, sizes, strict=True):
            for q in queues:
                add(deltas, q.endpoint, 1, size)
    if owners is not None:
        for owner, size in zip(owners, sizes, strict=True):
            if owner is not None:
                add(deltas, owner, 1, size)
    return deltas


@dataclass(slots=True)
class Tally:
    """The counters one write changes: its ops, and the totals to keep once it succeeded."""

    ops: list[Op]
    totals: Usage
    removed: tuple[RemovalReason, int] | None = None  # the removals it counts
    counts: RemovedCounts | None = None  # the removal counts then (with ``removed``)


class UsageBook:
    def __init__(self, backend: Backend) -> None:
        self._b = backend
        self._ingest = self._load_stats(_STATS_INGEST)
        self._maint = self._load_stats(_STATS_MAINT)
        self._removed_ingest = self._load_removed(_REMOVED_INGEST)
        self._removed_maint = self._load_removed(_REMOVED_MAINT)
        self.removed: dict[RemovalReason, int] = {
            r: self._removed_ingest.get(r, 0) + self._removed_maint.get(r, 0) for r in RemovalReason
        }
        self.inflight: Usage = {}
        self.space_freed = asyncio.Event()
        # Without the marker, the identities' counters may not cover what is stored: a store an older build wrote
        # is counted now; an empty one gets the marker with its first group write (no write at open).
        self._mark_identities = backend.get(META, _IDENTITIES_COUNTED) is None
        if self._mark_identities and backend.last_key(MESSAGES) is not None:
            self._count_identities()
            self._mark_identities = False

    def usage(self, key: str) -> tuple[int, int]:
        ic, ib = self._ingest.get(key, _NONE)
        mc, mb = self._maint.get(key, _NONE)
        fc, fb = self.inflight.get(key, _NONE)
        return ic + mc + fc, ib + mb + fb

    def ingested(self, key: str) -> tuple[int, int]:
        """(messages, bytes) ever written under ``key`` by ingest (durable writes only; never goes down)."""
        return self._ingest.get(key, (0, 0))

    def reserve(self, group_deltas: Usage, deltas: Usage) -> None:
        """Reserve ``deltas`` (in flight) and add them to the deltas of their group write."""
        inflight = self.inflight
        for k, (c, b) in deltas.items():
            ic, ib = inflight.get(k, (0, 0))
            inflight[k] = (ic + c, ib + b)
            gc, gb = group_deltas.get(k, (0, 0))
            group_deltas[k] = (gc + c, gb + b)

    def release(self, deltas: Usage) -> None:
        """A group write finished (or failed): its reservation goes."""
        inflight = self.inflight
        for k, (c, b) in deltas.items():
            ic, ib = inflight[k]  # reserved before, so there
            inflight[k] = (ic - c, ib - b)
        if deltas:
            self.space_freed.set()

    # -- the group-commit writer's counters ----------------------------------------------------------------
    def ingest_tally(self, deltas: Usage, overflow: int) -> Tally:
        """The counter ops of a group write adding ``deltas`` and dropping ``overflow`` references."""
        totals = _plus_usage(self._ingest, deltas)
        ops = _stats_ops(_STATS_INGEST, totals, totals)
        if self._mark_identities:
            ops.append((META, _IDENTITIES_COUNTED, b"1"))
        if not overflow:
            return Tally(ops, totals)
        counts = _plus(self._removed_ingest, RemovalReason.OVERFLOW, overflow)
        ops.append((META, _REMOVED_INGEST, msgspec.msgpack.encode(counts)))
        return Tally(ops, totals, (RemovalReason.OVERFLOW, overflow), counts)

    def ingest_written(self, tally: Tally) -> None:
        self._ingest.update(tally.totals)
        self._mark_identities = False
        if tally.removed is not None and tally.counts is not None:
            self._removed_ingest = tally.counts
            self.removed[tally.removed[0]] += tally.removed[1]

    # -- the maintenance writes' counters ------------------------------------------------------------------
    def maint_tally(self, deltas: Usage, removed: tuple[RemovalReason, int] | None) -> Tally:
        totals = _plus_usage(self._maint, deltas)
        ops = _stats_ops(_STATS_MAINT, totals, totals)
        if removed is None:
            return Tally(ops, totals)
        counts = _plus(self._removed_maint, *removed)
        ops.append((META, _REMOVED_MAINT, msgspec.msgpack.encode(counts)))
        return Tally(ops, totals, removed, counts)

    def maint_written(self, tally: Tally, *, freed: bool) -> None:
        self._maint.update(tally.totals)
        if tally.removed is not None and tally.counts is not None:
            self._removed_maint = tally.counts
            self.removed[tally.removed[0]] += tally.removed[1]
        if freed:
            self.space_freed.set()

    # -- loading -------------------------------------------------------------------------------------------
    def _load_stats(self, prefix: bytes) -> Usage:
        out: Usage = {}
        for k, v in self._b.scan(META, prefix, 1 << 30):
            if not k.startswith(prefix):
                break
            out[k[len(prefix) :].decode()] = msgspec.msgpack.decode(v, type=tuple[int, int])
        return out

    def _load_removed(self, key: bytes) -> RemovedCounts:
        raw = self._b.get(META, key)
        return {} if raw is None else msgspec.msgpack.decode(raw, type=RemovedCounts)

    def _count_identities(self) -> None:
        """Once, at the first open by a build that counts each identity's messages: count what a store written
        before holds per identity (read and decoded message by message, in chunks), into the maintenance
        counters with the marker, in one write. Later opens load the counters as the endpoints' are loaded."""
        # The one open that is not O(queues + identities): say so before, as it takes seconds per million messages.
        log.info("store.identities_counting reason=no_identity_counters")
        t0 = time.monotonic()
        counts: Usage = {}
        messages = 0
        start = b""
        while True:
            chunk = self._b.scan(MESSAGES, start, _SCAN_CHUNK)
            messages += len(chunk)
            for _, raw in chunk:
                message = decode_message(raw).to_message()
                owner = owner_of(message.system_properties)
                if owner is not None:
                    add(counts, owner, 1, charged_size(message))
            if len(chunk) < _SCAN_CHUNK:
                break
            start = pack_u64(unpack_u64(chunk[-1][0]) + 1)
        for k, (c, b) in counts.items():
            add(self._maint, k, c, b)
        self._b.write([*_stats_ops(_STATS_MAINT, self._maint, counts), (META, _IDENTITIES_COUNTED, b"1")], sync=True)
        log.info(
            "store.identities_counted identities=%d messages=%d elapsed_s=%.1f",
            len(counts),
            messages,
            time.monotonic() - t0,
        )


def _plus_usage(base: Usage, deltas: Usage) -> Usage:
    """The changed counters only (one per endpoint, identity and the store), as totals."""
    totals: Usage = {}
    for k, (c, b) in deltas.items():
        tc, tb = base.get(k, (0, 0))
        totals[k] = (tc + c, tb + b)
    return totals


def _stats_ops(prefix: bytes, totals: Usage, keys: Iterable[str]) -> list[Op]:
    return [(META, prefix + k.encode(), msgspec.msgpack.encode(totals[k])) for k in keys]


def _plus(counts: RemovedCounts, reason: RemovalReason, n: int) -> RemovedCounts:
    out = dict(counts)
    out[reason] = out.get(reason, 0) + n
    return out
