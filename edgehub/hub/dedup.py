"""Duplicate detection, an ingest stage of the hub: the duplicate window, kept durably in the store's metadata
(after Service Bus's duplicate detection window): a device that retries a message it never saw acked must not
have it stored twice, and the window must survive a restart, or a retry after one would be.

Off by default (``UpstreamOptions.duplicate_detection``). A message whose ``messageId`` was already accepted from
the same identity inside the window (``window_s``, default 600, from the first acceptance, on the hub's
``Clock``) is acknowledged to its sender and dropped (counted in ``duplicates``), never stored twice. A message
without a ``messageId`` is never a duplicate. Two parts:

* ``DuplicateDetector``, the bookkeeping in memory: which ``(identity, messageId)`` pairs were accepted, and
  when; bounded by ``max_entries`` (the oldest are forgotten first);
* ``DuplicateWindow``, what the hub calls: the detector kept durable. Which ids were accepted lives under
  ``dedup/`` in the store's metadata, one key per ``(identity, messageId)``:
  ``dedup/{identity, URL-quoted}/{messageId}`` → ``{"v": 1, "at": epoch s}``.

Invariants:
* **never marked seen before it is stored**: ``claim`` only looks; the record of an acceptance is written by
  ``store.admit_many(..., metadata=[claim.metadata, ...])`` in the same atomic group write as the message, and
  only a write that became durable makes it count (``accepted``). A failed write records nothing, so the
  device's retry is taken, not dropped;
* **a restart remembers the window**: ``load`` reads the records back (the hub's clock decides what is still in
  the window);
* **two copies in flight at once** (a retry in the same read as its original): the second is claimed only once
  the first is settled (``in_flight``), then is a duplicate if the first was stored, and goes on as new if it
  was not;
* **bounded**: ids that left the window (or were pushed out by ``max_entries``, oldest first) are forgotten
  and their keys deleted, a few at a time, in the group writes of later accepted messages. Forgetting can
  only let a duplicate through, never drop a new message. Expired keys left on disk by a crash are filtered
  out at ``load`` and deleted then.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from edgehub.core import Clock
from edgehub.store import Store

__all__ = ["DEDUP_PREFIX", "Claim", "DuplicateDetector", "DuplicateWindow"]

log = logging.getLogger(__name__)

DEDUP_PREFIX = "dedup/"
_DELETES_PER_WRITE = 64  # forgotten keys deleted in one accepted message's group write


def _key(identity: str, message_id: str) -> str:
    # The identity is quoted (its "/" too), so the first "/" after the prefix ends it and any message id fits.
    return f"{DEDUP_PREFIX}{quote(identity, safe='')}/{message_id}"


def _parse_key(key: str) -> tuple[str, str] | None:
    identity, sep, message_id = key[len(DEDUP_PREFIX) :].partition("/")
    if not sep or not identity:
        return None
    return unquote(identity), message_id


class DuplicateDetector:
    """The duplicate window's bookkeeping: which ``(identity, messageId)`` pairs were accepted, and when.

    Two steps, so that a message is never marked seen before it is stored: ``is_duplicate`` only looks (and
    counts a duplicate); ``remember`` records an acceptance, and the caller calls it only once the message is
    durable. ``expire`` forgets what left the window (or was pushed out by ``max_entries``) and returns those
    pairs, so a caller that keeps the window durably can delete them too, as ``DuplicateWindow`` does."""

    def __init__(self, *, clock: Clock, window_s: float = 600.0, max_entries: int = 1_000_000) -> None:
        if window_s <= 0 or max_entries <= 0:
            raise ValueError("window_s and max_entries must be positive")
        self._clock = clock
        self.window_s = window_s
        self.max_entries = max_entries
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()  # insertion order = acceptance order
        self._evicted: list[tuple[str, str]] = []
        self.duplicates = 0

    def is_duplicate(self, identity: str, message_id: str | None) -> bool:
        """True (and counted) when this identity's ``message_id`` was accepted inside the window. Records nothing.
        A message without a message id is never a duplicate."""
        if not message_id:
            return False
        at = self._seen.get((identity, message_id))
        if at is None or at <= self._clock.time() - self.window_s:
            return False
        self.duplicates += 1
        return True

    def remember(self, identity: str, message_id: str, at_s: float | None = None) -> None:
        """Record that the message was accepted (durably) at ``at_s`` (default: now)."""
        key = (identity, message_id)
        self._seen.pop(key, None)
        self._seen[key] = self._clock.time() if at_s is None else at_s
        while len(self._seen) > self.max_entries:
            self._evicted.append(self._seen.popitem(last=False)[0])

    def expire(self) -> list[tuple[str, str]]:
        """Forget the pairs accepted ``window_s`` or more ago, and those pushed out by ``max_entries`` (the
        oldest first: forgetting can only let a duplicate through, never drop a new message); return them."""
        gone, self._evicted = self._evicted, []
        horizon = self._clock.time() - self.window_s
        while self._seen:
            key, at = next(iter(self._seen.items()))
            if at > horizon:
                break
            self._seen.popitem(last=False)
            gone.append(key)
        return gone

    def __len__(self) -> int:
        return len(self._seen)


@dataclass(slots=True)
class Claim:
    """A message that may be stored: pass ``metadata`` to ``store.admit_many``, then call ``accepted`` or
    ``abandoned`` (exactly one of them)."""

    identity: str
    message_id: str
    at_s: float
    metadata: Mapping[str, bytes | None]
    _window: DuplicateWindow
    # The expired records this claim's write deletes (keys of ``metadata`` with None); kept again if it fails.
    deletes: list[str] = field(default_factory=list)
    _settled: bool = False

    def accepted(self) -> None:
        """The group write is durable: so is the message, and so is its record."""
        if not self._settled:
            self._settled = True
            self._window.settle(self, stored=True)

    def abandoned(self) -> None:
        """The message was refused, or its group write failed: nothing was recorded."""
        if not self._settled:
            self._settled = True
            self._window.settle(self, stored=False)


class DuplicateWindow:
    """See the module docstring. Use from one event loop."""

    def __init__(self, store: Store, *, clock: Clock, window_s: float, max_entries: int = 1_000_000) -> None:
        self._store = store
        self._clock = clock
        self._detector = DuplicateDetector(clock=clock, window_s=window_s, max_entries=max_entries)
        self._pending: dict[tuple[str, str], asyncio.Future[bool]] = {}
        self._doomed: dict[str, None] = {}  # keys of forgotten ids, in order, deleted with later writes

    @property
    def window_s(self) -> float:
        return self._detector.window_s

    @property
    def duplicates(self) -> int:
        """Messages acknowledged and dropped as duplicates since start."""
        return self._detector.duplicates

    def __len__(self) -> int:
        return len(self._detector)

    def load(self) -> None:
        """Read the accepted ids back from the store (after a restart)."""
        now = self._clock.time()
        horizon = now - self._detector.window_s
        entries: list[tuple[float, str, str]] = []
        for key, raw in self._store.metadata_items(DEDUP_PREFIX):
            parsed = _parse_key(key)
            try:
                at = float(json.loads(raw)["at"])
            except (ValueError, KeyError, TypeError):
                parsed = None
            if parsed is None:
                log.warning("hub.dedup_record_unreadable key=%s", key)
                self._doomed[key] = None
            elif at <= horizon:
                self._doomed[key] = None
            else:
                entries.append((at, *parsed))
        for at, identity, message_id in sorted(entries):
            self._detector.remember(identity, message_id, at)
        self._doom(self._detector.expire())
        log.info("hub.dedup_loaded ids=%d expired=%d window_s=%s", len(entries), len(self._doomed), self.window_s)

    def _doom(self, pairs: list[tuple[str, str]]) -> None:
        self._doomed.update((_key(i, m), None) for i, m in pairs)

    def in_flight(self, identity: str, message_id: str) -> asyncio.Future[bool] | None:
        """A copy of this message claimed and not settled yet: the future of its settlement (True: stored), which
        decides whether this one is a duplicate. ``claim`` the message once it is done; None: nothing in flight."""
        return self._pending.get((identity, message_id))

    def claim(self, identity: str, message_id: str) -> Claim | None:
        """None when the message is a duplicate (counted); else a ``Claim`` to store it under. Only while no copy
        is in flight (``in_flight``): that one decides first (ValueError)."""
        key = (identity, message_id)
        if key in self._pending:
            raise ValueError(f"message id {message_id!r} of {identity} is claimed already, and not settled")
        if self._detector.is_duplicate(identity, message_id):
            return None
        self._pending[key] = asyncio.get_running_loop().create_future()
        self._doom(self._detector.expire())
        own = _key(identity, message_id)
        self._doomed.pop(own, None)  # accepted again after its window: the new record must not be deleted later
        deletes = list(itertools.islice(self._doomed, _DELETES_PER_WRITE))
        for k in deletes:
            del self._doomed[k]
        now = self._clock.time()
        metadata: dict[str, bytes | None] = dict.fromkeys(deletes)
        metadata[own] = json.dumps({"v": 1, "at": now}).encode()
        return Claim(identity, message_id, now, metadata, self, deletes)

    def settle(self, claim: Claim, *, stored: bool) -> None:
        """``claim``'s write is done (``Claim.accepted``, ``Claim.abandoned``; once per claim): remember its id if
        ``stored``, else keep the deletes it carried for a later write; wake a copy waiting on it (``in_flight``)."""
        key = (claim.identity, claim.message_id)
        if stored:
            self._detector.remember(claim.identity, claim.message_id, claim.at_s)
        else:
            self._doomed.update(dict.fromkeys(claim.deletes))  # not deleted after all: with a later write
        fut = self._pending.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(stored)
