"""Queue policies (after the .NET Service Bus queue policy): message size, quotas, overflow, enqueue timeout.

A ``QueuePolicy`` applies per endpoint (all its priorities together), with a hub-wide default; ``StoreQuota``
bounds the whole store, and with ``identity_share`` each identity's part of it: a device or module whose
messages held in the store reach that share of ``max_bytes`` has its new messages refused at once
(``QuotaExceededError``), whatever the overflow policy, while the others go on (one device wrote 2 GB in 8 s
and kept it for the TTL). Sizes are ``Message.size_bytes()`` (body and properties) without the store's
``edgeMessageId`` and ``enqueuedTime`` stamps. Per endpoint a message counts once per queue that references
it; store-wide and per identity (its ``connectionDeviceId``/``connectionModuleId``) it counts once.

``disk_store_quota`` is the default of ``edgehub run``: what the store holds now plus half the free space of
its filesystem, capped. Half, because the charged sizes leave out what RocksDB adds on disk (keys, references,
the write-ahead log, and compaction, which can briefly need as much again).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from edgehub.core.message_size import check_max_message_size

__all__ = [
    "DEFAULT_IDENTITY_SHARE",
    "DEFAULT_MAX_MESSAGE_SIZE_BYTES",
    "DEFAULT_STORE_QUOTA_CAP_BYTES",
    "DEFAULT_STORE_QUOTA_FREE_FRACTION",
    "Overflow",
    "QueuePolicy",
    "StoreQuota",
    "disk_store_quota",
]

DEFAULT_MAX_MESSAGE_SIZE_BYTES = 262_144
DEFAULT_IDENTITY_SHARE = 0.25  # one device or module may hold a quarter of the store
DEFAULT_STORE_QUOTA_FREE_FRACTION = 0.5
DEFAULT_STORE_QUOTA_CAP_BYTES = 32 << 30  # 32 GiB: a gateway's backlog, not its disk


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
        check_max_message_size(self.max_message_size_bytes)
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
    identity_share: float | None = None  # of max_bytes, per identity; None: no per-identity bound

    def __post_init__(self) -> None:
        if (self.max_bytes is not None and self.max_bytes < 0) or (
            self.max_messages is not None and self.max_messages < 0
        ):
            raise ValueError("quotas must be >= 0")
        if self.identity_share is not None and not 0 < self.identity_share <= 1:
            raise ValueError("identity_share must be within (0, 1]")

    @property
    def identity_max_bytes(self) -> int | None:
        """The bytes one identity's messages may hold (None: unbounded)."""
        if self.max_bytes is None or self.identity_share is None:
            return None
        return int(self.max_bytes * self.identity_share)

    def fits(self, count: int, size: int) -> bool:
        return (self.max_messages is None or count <= self.max_messages) and (
            self.max_bytes is None or size <= self.max_bytes
        )


def disk_store_quota(
    path: Path,
    held_bytes: int,
    *,
    free_fraction: float = DEFAULT_STORE_QUOTA_FREE_FRACTION,
    cap_bytes: int = DEFAULT_STORE_QUOTA_CAP_BYTES,
) -> int:
    """A store-wide byte quota from the filesystem ``path`` is on: ``held_bytes`` (what the store holds now)
    plus ``free_fraction`` of the free space, at most ``cap_bytes``. Computed once, at start."""
    if not 0 < free_fraction <= 1 or cap_bytes < 1:
        raise ValueError("free_fraction must be within (0, 1] and cap_bytes positive")
    free = shutil.disk_usage(path).free
    return min(held_bytes + int(free * free_fraction), cap_bytes)
