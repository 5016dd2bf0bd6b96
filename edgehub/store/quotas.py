"""Admission of messages to the store (connections are admitted elsewhere: ``edgehub.hub.connection_admission``):
size limits, quotas (per endpoint, store-wide, each identity's share of the store), waits for room and the
overflow policies (``edgehub.store.policy``).

Invariants:
* a message over its identity's share is refused at once (``QuotaExceededError``), whatever the overflow policy:
  waiting for the same device's backlog to drain over a thin uplink would only hold its connection;
* a wait for room ends ``enqueue_timeout_s`` (the strictest full quota's) after the message arrived; then
  ``rejectIncoming`` refuses it, ``discardIncoming`` drops the full endpoints' references (the caller counts
  them once its write is durable), ``discardOldest`` evicts from the head of the lowest-priority queue until it
  fits (delivered references first);
* a group is admitted as a whole only when the store-wide byte quota and the identity share are the only bounds
  (``needs_turns`` is False) and it fits both (``group_fits``); else each message is admitted in turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from edgehub.core import Clock, MessageTooLargeError, QuotaExceededError
from edgehub.core.refusals import RateLimitedLog
from edgehub.store.policy import Overflow, QueuePolicy, StoreQuota
from edgehub.store.usage import OWNER, STORE_WIDE, UsageBook

__all__ = ["Quotas"]

log = logging.getLogger(__name__)

# Removes one reference (delivered first, else the oldest) from the lowest-priority non-empty queue of the
# endpoint (any endpoint: None); False when there is none.
EvictOne = Callable[[str | None], Awaitable[bool]]


def _bounded(limits: QueuePolicy | StoreQuota) -> bool:
    return limits.max_bytes is not None or limits.max_messages is not None


def too_large(size: int, limit: int) -> MessageTooLargeError:
    return MessageTooLargeError(f"message of {size} bytes is over maxMessageSizeBytes={limit}")


class Quotas:
    """The policies (settable while the store runs: ``store_quota`` is set once the store's size is known) and
    the checks made with them."""

    def __init__(
        self,
        usage: UsageBook,
        clock: Clock,
        evict_one: EvictOne,
        *,
        default_policy: QueuePolicy | None,
        endpoint_policies: Mapping[str, QueuePolicy] | None,
        store_quota: StoreQuota | None,
    ) -> None:
        self._usage = usage
        self._clock = clock
        # Devices decide how often a full endpoint discards what they send: a few lines a minute per endpoint set.
        self._lines = RateLimitedLog(log, clock=clock)
        self._evict_one = evict_one
        self.default_policy = default_policy or QueuePolicy()
        self.endpoint_policies: dict[str, QueuePolicy] = dict(endpoint_policies or {})
        self.store_quota = store_quota or StoreQuota()

    def policy(self, endpoint: str) -> QueuePolicy:
        return self.endpoint_policies.get(endpoint, self.default_policy)

    def quotas_set(self) -> bool:
        """Whether any count or byte quota is set (then ``make_room`` has something to check)."""
        return (
            _bounded(self.store_quota)
            or _bounded(self.default_policy)
            or any(_bounded(p) for p in self.endpoint_policies.values())
        )

    def policies_may_apply(self) -> bool:
        """Whether any quota or endpoint policy is set (else only the default size limit applies)."""
        return bool(self.endpoint_policies) or self.quotas_set()

    def needs_turns(self) -> bool:
        """Whether a group must be admitted message by message (see the module docstring)."""
        return (
            bool(self.endpoint_policies) or _bounded(self.default_policy) or self.store_quota.max_messages is not None
        )

    def largest_message_size_bytes(self) -> int:
        """The largest ``max_message_size_bytes`` of any policy (the hub's default and each endpoint's): the
        most ``check_size`` can take, whatever a message's routes; what the protocol heads read up to
        (``edgehub.core.message_size.read_bound_bytes``)."""
        policies = [self.default_policy, *self.endpoint_policies.values()]
        return max(p.max_message_size_bytes for p in policies)

    def check_size(self, endpoints: Iterable[str], size: int) -> None:
        limit = min(self.policy(e).max_message_size_bytes for e in endpoints)
        if size > limit:
            raise too_large(size, limit)

    def group_fits(self, sizes: Sequence[int], owners: Sequence[str | None] | None, sender_key: str | None) -> bool:
        """Whether a whole group fits the store-wide byte quota and each sender's share (every message counted,
        routed or not: erring on the side of the careful path). One sender (``sender_key``), or each message's
        (``owners``)."""
        sq = self.store_quota
        total = sum(sizes)
        if sq.max_bytes is not None and self._usage.usage(STORE_WIDE)[1] + total > sq.max_bytes:
            return False
        share = sq.identity_max_bytes
        if share is None:
            return True
        if owners is None:  # the hub's groups: one sender
            return sender_key is None or self._usage.usage(sender_key)[1] + total <= share
        per_owner: dict[str | None, int] = {}
        for owner, size in zip(owners, sizes, strict=True):
            per_owner[owner] = per_owner.get(owner, 0) + size
        return all(o is None or self._usage.usage(o)[1] + b <= share for o, b in per_owner.items())

    def _check_share(self, owner: str | None, size: int) -> None:
        """Refuse at once a message that would take its identity over its share of the store."""
        share = self.store_quota.identity_max_bytes
        if owner is None or share is None:
            return
        held = self._usage.usage(owner)[1]
        if held + size > share:
            who = owner[len(OWNER) :]
            log.debug("store.identity_quota_exceeded identity=%s held_bytes=%d share_bytes=%d", who, held, share)
            raise QuotaExceededError(f"identity {who} holds {held} bytes in the store; its share is {share} bytes")

    def _full(self, endpoints: Iterable[str], per_endpoint: Mapping[str, int], size: int) -> list[str | None]:
        """Endpoints whose quota this message would exceed, and None when the store-wide quota would be."""
        full: list[str | None] = []
        for e in endpoints:
            p = self.policy(e)
            c, b = self._usage.usage(e)
            n = per_endpoint[e]
            if (p.max_messages is not None and c + n > p.max_messages) or (
                p.max_bytes is not None and b + n * size > p.max_bytes
            ):
                full.append(e)
        c, b = self._usage.usage(STORE_WIDE)
        if not self.store_quota.fits(c + 1, b + size):
            full.append(None)
        return full

    def has_room(self, per_endpoint: Mapping[str, int], size: int, owner: str | None) -> bool:
        """Check a message at once: refuse it over the strictest routed endpoint's size limit or over its
        sender's share (``owner``); True if it fits every quota now, else ``make_room`` is to be awaited.
        ``per_endpoint``: the message's references per routed endpoint."""
        self.check_size(per_endpoint, size)
        if not self.quotas_set():  # no quota: nothing else to check
            return True
        self._check_share(owner, size)
        return not self._full(per_endpoint, per_endpoint, size)

    async def make_room(
        self, per_endpoint: Mapping[str, int], size: int, arrived_mono_s: float | None, owner: str | None
    ) -> set[str]:
        """For a message ``has_room`` found no room for: wait for room (until ``enqueue_timeout_s`` after
        ``arrived_mono_s``, default now), then apply the overflow policy. Returns the endpoints to drop
        (discardIncoming)."""
        endpoints = per_endpoint.keys()
        full = self._full(endpoints, per_endpoint, size)
        if not full:
            return set()
        timeout = min(self.policy(e).enqueue_timeout_s if e else self.default_policy.enqueue_timeout_s for e in full)
        clock = self._clock
        deadline = (clock.monotonic() if arrived_mono_s is None else arrived_mono_s) + timeout
        while full and (remaining := deadline - clock.monotonic()) > 0:
            freed_event = self._usage.space_freed
            freed_event.clear()
            sleeper = asyncio.ensure_future(clock.sleep(remaining))
            freed = asyncio.ensure_future(freed_event.wait())
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
                    dropped |= set(endpoints)
                else:
                    dropped.add(e)
                continue
            if not await self._evict(e, per_endpoint, size):
                raise QuotaExceededError(f"quota of {where} exceeded and nothing left to discard")
        if dropped:
            where = ",".join(sorted(dropped))
            self._lines.line(where, "store.discarded_incoming", endpoints=where)
        return dropped

    async def _evict(self, endpoint: str | None, per_endpoint: Mapping[str, int], size: int) -> bool:
        """discardOldest: evict (of ``endpoint``, or of any endpoint for the store-wide quota) until the message
        fits. False if it cannot be made to fit."""
        while True:
            still = [x for x in self._full([endpoint] if endpoint else [], per_endpoint, size) if x == endpoint]
            if not still:
                return True
            if not await self._evict_one(endpoint):
                return False
