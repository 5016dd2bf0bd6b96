"""The executor's values and per-queue state: the dead-letter reasons, the executor's settings, the retry and
pipeline state of one queue (endpoint, priority) and a batch in flight to a pipelined endpoint.

Invariants:
* ``ExecutorSettings`` refuses a ``max_delivery_attempts`` below 1 and a ``cleanup_interval_s`` that is not
  positive (``ValueError``) when built;
* a queue's state starts IDLE with its cursor just past the store's committed offset and its health
  (``unhealthy_since_s``, ``last_revival_s``) as the store's checkpoint recorded it;
* ``pending`` empty means nothing to retry; ``clear_retry`` empties it and restarts the retry schedule;
* the state moves only through ``fire`` (the table in ``fsm``): an illegal event raises ``InvalidTransition``.

Only ``edgehub.delivery.executor`` changes these; the executor's docstring says when.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from edgehub.delivery.checkpointer import Checkpointer
from edgehub.delivery.endpoint import SendResult
from edgehub.delivery.fsm import Event, State, next_state
from edgehub.delivery.retry import RetryPolicy
from edgehub.store import QueueId, StoredItem

__all__ = ["DeadLetterReason", "ExecutorSettings", "SendStats"]


class DeadLetterReason:
    INVALID = "invalid"
    MAX_DELIVERY_ATTEMPTS = "maxDeliveryAttempts"
    RETRY_EXHAUSTED = "retryPolicyExhausted"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorSettings:
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)  # the hub's
    endpoint_retry_policy: RetryPolicy | None = None  # this endpoint's override (ignored if the hub's says so)
    max_delivery_attempts: int | None = None  # None: no limit (the retry policy and TTL decide)
    cleanup_interval_s: float = 60.0
    check_entire_queue_on_cleanup: bool = False
    unhealthy_after_s: float = 3600.0  # failing this long marks the queue DEAD (still retried)

    def __post_init__(self) -> None:
        if self.max_delivery_attempts is not None and self.max_delivery_attempts < 1:
            raise ValueError("max_delivery_attempts must be >= 1")
        if self.cleanup_interval_s <= 0:
            raise ValueError("cleanup_interval_s must be > 0")


class _QueueState:
    def __init__(self, committed: int, unhealthy_since_s: float | None, last_revival_s: float | None) -> None:
        self.checkpointer = Checkpointer(committed)
        self.cursor = committed + 1  # where the next new batch is read from
        self.state = State.IDLE
        self.unhealthy_since_s = unhealthy_since_s
        self.last_revival_s = last_revival_s
        # The retry state of the batch that failed; ``pending`` empty: nothing to retry.
        self.pending: list[StoredItem] = []
        self.failures = 0  # failed sends of ``pending`` since its retry schedule (re)started
        self.retry_at_mono_s = 0.0  # on the clock's monotonic scale
        self.failed_send_seq = 0  # the executor's signal sequence number when the failed send began
        self.attempts: dict[int, int] = {}  # offset -> failed deliveries counted against the message
        self.inflight = 0  # batches of this queue submitted to a pipelined endpoint and not settled yet
        self.linger_until_mono_s: float | None = None  # a short batch waits for more until then

    def fire(self, event: Event) -> None:
        self.state = next_state(self.state, event)

    def clear_retry(self) -> None:
        self.pending = []
        self.failures = 0


class SendStats:
    """The executor's sends, counted once per batch when its result is in (never per message), for ``/metrics``:
    batches settled, messages the endpoint acknowledged in them, and the seconds from handing each batch over to
    its result, summed."""

    __slots__ = ("batches", "messages", "seconds")

    def __init__(self) -> None:
        self.batches = 0
        self.messages = 0
        self.seconds = 0.0

    def settled(self, result: SendResult, seconds: float) -> None:
        self.batches += 1
        self.messages += len(result.succeeded)
        self.seconds += seconds


@dataclass(slots=True)
class _InFlight:
    """A batch submitted to a pipelined endpoint, not settled yet."""

    q: QueueId
    qs: _QueueState
    items: list[StoredItem]
    seq: int
    probe: bool
    result: asyncio.Future[SendResult]
    started_mono_s: float  # when it was handed to the endpoint, on the executor clock's monotonic scale
