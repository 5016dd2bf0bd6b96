"""The store's value types and its column families' names: what callers get back (``StoredItem``, ``Reference``,
``EnqueueReceipt``, ``Checkpoint``, ``DeadLetter``) and the enums they are configured and counted with.

Invariants: a message's charged size leaves out the hub's ``edgeMessageId`` and ``enqueuedTime``; these types
carry no behaviour beyond derived properties; the ones built per message are msgspec
Structs (a Struct's C ``__init__`` is far cheaper than a frozen dataclass's; none takes part in a reference
cycle, hence ``gc=False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import msgspec

from edgehub.core import Message, SystemProperty, expiry
from edgehub.store.queues import QueueId

__all__ = [
    "CHECKPOINTS",
    "DEFAULT_TTL_S",
    "MESSAGES",
    "META",
    "Checkpoint",
    "DeadLetter",
    "EnqueueReceipt",
    "FsyncPolicy",
    "Reference",
    "RemovalReason",
    "StoredItem",
    "charged_size",
]

MESSAGES = "messages"
CHECKPOINTS = "checkpoints"
META = "meta"
DEFAULT_TTL_S = 7200.0
# The hub's stamps, left out of what a message is charged: it is charged as its producer sent it.
_STAMPS = frozenset((SystemProperty.EDGE_MESSAGE_ID.value, SystemProperty.ENQUEUED_TIME.value))


def charged_size(message: Message) -> int:
    """The size quotas and ``maxMessageSizeBytes`` see: ``message.size_bytes()`` less ``edgeMessageId`` and
    ``enqueuedTime`` (the hub stamps them before handing a message over)."""
    return message.size_bytes(leaving_out=_STAMPS)


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
    DROPPED = "dropped"  # its endpoint was dropped by a deployment update that asked for it


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
        return expiry.expires_at_s(self)


class Reference(msgspec.Struct, frozen=True, gc=False):
    """A reference without its message: what cleanup and quota accounting look at."""

    offset: int
    message_key: int
    enqueued_at_s: float
    ttl_s: float
    size_bytes: int

    @property
    def expires_at_s(self) -> float:
        return expiry.expires_at_s(self)


class EnqueueReceipt(msgspec.Struct, frozen=True, gc=False):
    """The message as stored and where it went: ``(queue, offset)`` per reference (empty: routed nowhere)."""

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
