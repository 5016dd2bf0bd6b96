"""Queue policies (after the .NET Service Bus queue policy): message size, quotas, overflow, enqueue timeout.

A ``QueuePolicy`` applies per endpoint (all its priorities together), with a hub-wide default; ``StoreQuota``
bounds the whole store. Sizes are ``Message.size_bytes()`` (body and properties) without the store's
``edgeMessageId`` and ``enqueuedTime`` stamps. Per endpoint a message counts once per queue that references
it; store-wide it counts once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["DEFAULT_MAX_MESSAGE_SIZE_BYTES", "Overflow", "QueuePolicy", "StoreQuota"]

DEFAULT_MAX_MESSAGE_SIZE_BYTES = 262_144


class Overflow(StrEnum):
    """What a full queue does with a new message, once ``enqueue_timeout_s`` has passed without space."""

    REJECT_INCOMING = "rejectIncoming"  # the producer gets QuotaExceededError; nothing stored
    DISCARD_INCOMING = "discardIncoming"  # acknowledged and counted (overflow), not stored for that endpoint
    DISCARD_OLDEST = "discardOldest"  # evict from the head of the lowest-priority queue until it fits


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePolicy:
    max_message_size_bytes: int = DEFAULT_MAX_MESSAGE_SIZE_BYTES
    max_bytes: int | None = None
    max_messages: int | None = None
    overflow: Overflow = Overflow.REJECT_INCOMING
    enqueue_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_message_size_bytes < 1:
            raise ValueError("max_message_size_bytes must be >= 1")
        if (self.max_bytes is not None and self.max_bytes < 0) or (
            self.max_messages is not None and self.max_messages < 0
        ):
            raise ValueError("quotas must be >= 0")
        if not 0 <= self.enqueue_timeout_s <= 60:
            raise ValueError("enqueue_timeout_s must be within 0..60")


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreQuota:
    max_bytes: int | None = None
    max_messages: int | None = None

    def fits(self, count: int, size: int) -> bool:
        return (self.max_messages is None or count <= self.max_messages) and (
            self.max_bytes is None or size <= self.max_bytes
        )
