"""The time-to-live rule, in one place for every layer that applies it.

A message is stored with ``enqueued_at_s`` (epoch seconds) and ``ttl_s`` (seconds), both fixed at enqueue. It
expires at their sum, and from that instant on, inclusive, it is never sent: the executor drops it when it reads
or retries a batch, and cleanup removes it from its queue, both counted as ``RemovalReason.TTL``.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Expiring", "expires_at_s", "has_expired"]


class Expiring(Protocol):
    """Anything stored with an enqueue time and a TTL: a stored item, a reference, a queued message."""

    @property
    def enqueued_at_s(self) -> float: ...

    @property
    def ttl_s(self) -> float: ...


def expires_at_s(item: Expiring) -> float:
    """The instant (epoch seconds) from which ``item`` is never sent."""
    return item.enqueued_at_s + item.ttl_s


def has_expired(item: Expiring, now_s: float) -> bool:
    """Whether ``item`` may no longer be sent at ``now_s`` (its expiry instant counts as expired)."""
    return item.enqueued_at_s + item.ttl_s <= now_s
