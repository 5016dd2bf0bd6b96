"""The one narrow seam between the endpoint executor and whatever takes messages out of the hub.

An endpoint is given batches by its executor, never concurrently (one ``send`` at a time per endpoint), each
batch holding messages of one priority in queue order. It answers with a ``SendResult`` that sorts every
message of the batch into exactly one of: succeeded (delivered; the executor checkpoints it), failed (not
delivered; retried under the retry policy), invalid (will never be delivered; dead-lettered at once).
A message missing from all three counts as failed. ``send`` should not raise; if it does, the whole batch
counts as failed with kind TRANSIENT.

Reachability: an endpoint that learns it can deliver again (a link comes up, a module connects) calls the
``on_reachable`` callback given to ``bind``; the executor then cuts any retry wait short. An endpoint that can
also tell that it lost its way out (a connection dropped, a module disconnected) implements
``ReportsUnreachable`` as well and calls ``on_unreachable``: the executor then parks the endpoint's queues (no
sends, and no attempts counted against ``maxDeliveryAttempts``) until it reports reachable again or a retry
delay has passed. That part is optional: an endpoint without ``bind_unreachable`` is never taken for
unreachable, and its failed sends alone drive the retries. Both callbacks are called on the executor's event
loop, and may be called any number of times in any order; the last one called holds.

Pipelining: over a link with a long round trip, one batch at a time leaves the link idle while each batch waits
for its acknowledgement. An endpoint that can keep several batches on their way implements
``PipelinedEndpoint`` as well: the executor then waits until it ``has_room`` before it chooses the next batch
(so the choice is made when the batch can go at once, and a high priority that arrived meanwhile is chosen first),
hands the batch over with ``submit`` and goes on choosing; each batch's result is its own checkpoint, settled
in the order the batches were submitted. ``send`` stays the way to deliver one batch and wait for it.

Priorities it cannot carry now: an endpoint that can take some priorities and not others at a time (an upstream
over several links, ``edgehub.upstream.links``) implements ``CarriesPriorities``: the executor leaves a queue
whose priority it does not carry alone (no send, no attempt counted, its messages' TTLs running), and looks again
when the endpoint calls ``on_reachable``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import msgspec

from edgehub.core import FailureKind, Message, expiry

__all__ = ["CarriesPriorities", "Endpoint", "PipelinedEndpoint", "QueuedMessage", "ReportsUnreachable", "SendResult"]


# A msgspec Struct, not a dataclass: one is built for every message, and its C __init__ takes an eighth of the
# time of a frozen dataclass's (no reference cycles go through it, hence gc=False).
class QueuedMessage(msgspec.Struct, frozen=True, gc=False):
    """A message as it stands in one endpoint queue."""

    message: Message
    offset: int  # position in its queue (endpoint, priority); grows forever, across restarts
    priority: int  # 0 highest; DEFAULT_PRIORITY for routes without one
    enqueued_at_s: float  # epoch seconds, fixed at enqueue
    ttl_s: float  # seconds, fixed at enqueue; never sent from enqueued_at_s + ttl_s on (edgehub.core.expiry)
    attempts: int = 0  # deliveries tried before this one

    @property
    def expires_at_s(self) -> float:
        return expiry.expires_at_s(self)


@dataclass(frozen=True, slots=True)
class SendResult:
    """What became of a batch. ``failure_kind`` and ``error`` describe the failed/invalid part, if any;
    ``invalid_errors`` says, by offset, why an invalid message can never be delivered when the endpoint knows it
    message by message (a dead letter carries it; ``error`` otherwise)."""

    succeeded: Sequence[QueuedMessage] = ()
    failed: Sequence[QueuedMessage] = ()
    invalid: Sequence[QueuedMessage] = ()
    failure_kind: FailureKind | None = None
    error: str | None = None
    details: dict[str, str] = field(default_factory=dict)
    invalid_errors: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def all_succeeded(cls, batch: Sequence[QueuedMessage]) -> SendResult:
        return cls(succeeded=tuple(batch))

    @classmethod
    def all_failed(cls, batch: Sequence[QueuedMessage], kind: FailureKind, error: str) -> SendResult:
        return cls(failed=tuple(batch), failure_kind=kind, error=error)


@runtime_checkable
class Endpoint(Protocol):
    """Where an executor delivers. Implementations: module inputs, upstream transports, test endpoints."""

    @property
    def endpoint_id(self) -> str:
        """The id routes name (``$upstream``, ``/modules/m/inputs/i``); used in queue ids and logs."""
        ...

    @property
    def max_batch_messages(self) -> int:
        """The most messages this endpoint wants in one ``send``."""
        ...

    def bind(self, on_reachable: Callable[[], None]) -> None:
        """Called once by the executor before the first send."""
        ...

    async def send(self, batch: Sequence[QueuedMessage]) -> SendResult:
        """Deliver ``batch`` (one priority, queue order, non-empty)."""
        ...

    async def close(self) -> None:
        """Release what the endpoint holds. No ``send`` follows."""
        ...


@runtime_checkable
class ReportsUnreachable(Protocol):
    """What an ``Endpoint`` adds to report that it cannot deliver any more (see the module docstring)."""

    def bind_unreachable(self, on_unreachable: Callable[[], None]) -> None:
        """Called once by the executor, after ``bind`` and before the first send."""
        ...


@runtime_checkable
class PipelinedEndpoint(Protocol):
    """What an ``Endpoint`` adds to take several batches at once (see the module docstring)."""

    @property
    def linger_s(self) -> float:
        """While batches are in flight, how long a batch shorter than ``max_batch_messages`` may wait for more
        messages before it is sent (0: never waits). With nothing in flight a batch goes at once."""
        ...

    @property
    def has_room(self) -> bool:
        """Whether a new batch would go on its way at once (the bytes already in flight leave room for it), or
        waiting is pointless (not connected: the next ``submit`` fails at once). While it is False the executor
        waits for a batch in flight to settle."""
        ...

    async def submit(self, batch: Sequence[QueuedMessage]) -> asyncio.Future[SendResult]:
        """Hand ``batch`` (one priority, queue order, non-empty) over and return once it is on its way; the
        future resolves to its ``SendResult`` (the same contract as ``send``) and should not fail."""
        ...


@runtime_checkable
class CarriesPriorities(Protocol):
    """What an ``Endpoint`` adds to refuse some priorities for a while (see the module docstring)."""

    def carries(self, priority: int) -> bool:
        """Whether a batch of ``priority`` would be taken now. Cheap: asked at every choice of the executor."""
        ...
