"""One executor per endpoint: takes references from the endpoint's queues and hands batches to the endpoint.

Invariants:
* the pump serves the highest priority that has messages, one priority per batch, and chooses again from the
  top after every batch; while a batch is in flight it prefetches the next batch of the same queue, and drops
  that prefetch if a higher priority has messages by then;
* a reference whose TTL (fixed at enqueue) has passed is never sent: it is removed, counted as ``ttl``;
* a queue's checkpoint never moves past the first message still owed (``Checkpointer``);
* failed messages of a batch are retried (in order, before anything later in that queue) under the retry policy;
  a wait is cut short when the endpoint reports it is reachable; a message the endpoint calls invalid, or that
  failed ``max_delivery_attempts`` times, or whose retry policy ran out, goes to the dead-letter queue;
* the cleanup processor removes delivered and expired references every ``cleanup_interval_s`` (head-only, or the
  whole queue with ``check_entire_queue_on_cleanup``); the store deletes a body with its last reference.

Use: ``async with EndpointExecutor(store, endpoint, ...) as ex: ...``; call ``ex.notify()`` after enqueueing to
one of its queues (the hub does, after ``store.enqueue``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from edgehub.core import Clock, FailureKind, StoreClosedError, StoreError, SystemClock
from edgehub.delivery.checkpointer import Checkpointer
from edgehub.delivery.endpoint import Endpoint, QueuedMessage, SendResult
from edgehub.delivery.fsm import Event, State, next_state
from edgehub.delivery.retry import RetryPolicy, effective_policy
from edgehub.store import QueueId, RemovalReason, Store, StoredItem

__all__ = ["DeadLetterReason", "EndpointExecutor", "ExecutorSettings"]

log = logging.getLogger(__name__)

STORE_RETRY_S = 1.0  # after a store failure, the pump starts over this much later


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


@dataclass(slots=True)
class _Batch:
    queue: QueueId
    items: list[StoredItem]


class _QueueState:
    def __init__(self, committed: int, unhealthy_since_s: float | None, last_revival_s: float | None) -> None:
        self.checkpointer = Checkpointer(committed)
        self.cursor = committed + 1
        self.state = State.IDLE
        self.unhealthy_since_s = unhealthy_since_s
        self.last_revival_s = last_revival_s

    def fire(self, event: Event) -> None:
        self.state = next_state(self.state, event)


class EndpointExecutor:
    """Delivers one endpoint's queues. See the module docstring."""

    def __init__(
        self, store: Store, endpoint: Endpoint, *, clock: Clock | None = None, settings: ExecutorSettings | None = None
    ) -> None:
        self._store = store
        self._endpoint = endpoint
        self._id = endpoint.endpoint_id
        self._clock: Clock = clock or SystemClock()
        self._settings = settings or ExecutorSettings()
        self._queues: dict[QueueId, _QueueState] = {}
        self._attempts: dict[tuple[QueueId, int], int] = {}
        self._wake = asyncio.Event()
        self._reachable = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.batches_sent = 0
        self.cleanups_run = 0
        self._changed = asyncio.Event()  # set after every commit, dead letter and cleanup (see wait_for)
        endpoint.bind(self._on_reachable)

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        self._tasks = [
            self._tg.create_task(self._pump(), name=f"executor.pump:{self._id}"),
            self._tg.create_task(self._cleanup_loop(), name=f"executor.cleanup:{self._id}"),
        ]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for t in self._tasks:
            t.cancel()
        assert self._tg is not None
        try:
            await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            for qs in self._queues.values():
                qs.fire(Event.CLOSE)
            await self._endpoint.close()

    def notify(self) -> None:
        """New references were enqueued for this endpoint."""
        self._wake.set()

    def _on_reachable(self) -> None:
        self._reachable.set()
        self._wake.set()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, checked after each commit, dead letter and cleanup. Bound it with
        ``asyncio.timeout``: meant for tests and tools that wait for progress."""
        while not condition():
            self._changed.clear()
            await self._changed.wait()

    def state(self, priority: int) -> State:
        qs = self._queues.get(QueueId(self._id, priority))
        return qs.state if qs else State.IDLE

    def _qs(self, q: QueueId) -> _QueueState:
        qs = self._queues.get(q)
        if qs is None:
            cp = self._store.checkpoint(q)
            qs = self._queues[q] = _QueueState(cp.committed, cp.unhealthy_since_s, cp.last_revival_s)
        return qs

    # -- pump ---------------------------------------------------------------------------------------------
    def _best_queue(self) -> QueueId | None:
        for q in self._store.queues(self._id):  # highest priority first
            if self._store.end_offset(q) > self._qs(q).cursor:
                return q
        return None

    def _read(self, q: QueueId, from_offset: int) -> list[StoredItem]:
        return self._store.read(q, from_offset, self._endpoint.max_batch_messages)

    async def _take_batch(self, q: QueueId, items: list[StoredItem]) -> list[StoredItem]:
        """Advance the cursor past ``items``; drop (and remove) the expired ones."""
        qs = self._qs(q)
        if items:
            qs.cursor = items[-1].offset + 1
        qs.checkpointer.propose(it.offset for it in items)
        now = self._clock.time()
        expired = [it for it in items if it.expires_at_s <= now]
        if expired:
            await self._store.remove(q, [it.offset for it in expired], RemovalReason.TTL)
            await self._commit(q, qs.checkpointer.commit([it.offset for it in expired]))
        return [it for it in items if it.expires_at_s > now]

    async def _pump(self) -> None:
        """Run the pump; a store failure (a full disk) is logged, the in-memory queue state is rebuilt from the
        committed checkpoints (at-least-once: what was in flight is sent again) and the pump starts over."""
        while True:
            try:
                await self._pump_once()
            except StoreClosedError:
                raise
            except StoreError as exc:
                log.warning("executor.store_failed endpoint=%s error=%s retry_in_s=%s", self._id, exc, STORE_RETRY_S)
                self._queues.clear()
                await self._clock.sleep(STORE_RETRY_S)

    async def _pump_once(self) -> None:
        prefetch: asyncio.Task[list[StoredItem]] | None = None
        prefetch_q: QueueId | None = None
        while True:
            q = self._best_queue()
            if q is None:
                self._wake.clear()
                if self._best_queue() is None:
                    await self._wake.wait()
                continue
            qs = self._qs(q)
            raw: list[StoredItem] = []
            if prefetch is not None and prefetch_q == q:
                raw = [it for it in await prefetch if qs.checkpointer.admit(it.offset)]  # stale ones dropped
            elif prefetch is not None:
                prefetch.cancel()
            prefetch = None
            if not raw:  # nothing prefetched, or read before new arrivals: read now
                raw = [it for it in self._read(q, qs.cursor) if qs.checkpointer.admit(it.offset)]
            if not raw:
                # references were removed under the cursor (cleanup); skip to the end of the queue
                qs.cursor = self._store.end_offset(q)
                continue
            items = await self._take_batch(q, raw)
            if not items:
                continue
            nxt = qs.cursor
            prefetch = asyncio.create_task(asyncio.to_thread(self._read, q, nxt), name=f"executor.prefetch:{q}")
            prefetch_q = q
            try:
                await self._deliver(q, items)
            except BaseException:
                prefetch.cancel()
                raise

    async def _send(self, q: QueueId, items: Sequence[StoredItem]) -> SendResult:
        batch = [
            QueuedMessage(
                it.message, it.offset, q.priority, it.enqueued_at_s, it.ttl_s, self._attempts.get((q, it.offset), 0)
            )
            for it in items
        ]
        try:
            result = await self._endpoint.send(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("endpoint.send_raised endpoint=%s error=%s", self._id, exc)
            result = SendResult.all_failed(batch, FailureKind.TRANSIENT, str(exc))
        self.batches_sent += 1
        return result

    async def _deliver(self, q: QueueId, items: list[StoredItem]) -> None:
        qs = self._qs(q)
        by_offset = {it.offset: it for it in items}
        qs.fire(Event.BATCH)
        policy = effective_policy(self._settings.retry_policy, self._settings.endpoint_retry_policy)
        failures = 0
        pending = items
        while True:
            result = await self._send(q, pending)
            ok = {m.offset for m in result.succeeded} & by_offset.keys()
            invalid = {m.offset for m in result.invalid} & by_offset.keys() - ok
            failed = [it for it in pending if it.offset not in ok and it.offset not in invalid]
            done = set(ok)
            for off in sorted(invalid):
                await self._dead_letter(q, by_offset[off], DeadLetterReason.INVALID, result.error)
                done.add(off)
            if not failed:
                qs.fire(Event.SENT_OK)
                if qs.unhealthy_since_s is not None:
                    qs.unhealthy_since_s = None
                await self._commit(q, qs.checkpointer.commit(done))
                qs.fire(Event.COMMITTED)
                return
            qs.fire(Event.SENT_FAILED)
            failures += 1
            now = self._clock.time()
            if qs.unhealthy_since_s is None:
                qs.unhealthy_since_s = now
            log.info(
                "endpoint.send_failed endpoint=%s priority=%d failed=%d kind=%s",
                self._id,
                q.priority,
                len(failed),
                result.failure_kind or FailureKind.TRANSIENT,
            )
            still: list[StoredItem] = []
            for it in failed:
                n = self._attempts[(q, it.offset)] = self._attempts.get((q, it.offset), 0) + 1
                limit = self._settings.max_delivery_attempts
                if limit is not None and n >= limit:
                    await self._dead_letter(q, it, DeadLetterReason.MAX_DELIVERY_ATTEMPTS, result.error)
                    done.add(it.offset)
                elif it.expires_at_s <= now:
                    await self._store.remove(q, [it.offset], RemovalReason.TTL)
                    done.add(it.offset)
                else:
                    still.append(it)
            delay = policy.delay_s(failures)
            if still and delay is None:
                for it in still:
                    await self._dead_letter(q, it, DeadLetterReason.RETRY_EXHAUSTED, result.error)
                    done.add(it.offset)
                still = []
            await self._commit(q, qs.checkpointer.commit(done, [it.offset for it in still]))
            if not still:
                qs.fire(Event.GIVE_UP)
                qs.fire(Event.COMMITTED)
                return
            if now - qs.unhealthy_since_s >= self._settings.unhealthy_after_s and qs.state is State.FAILING:
                qs.fire(Event.UNHEALTHY)
            assert delay is not None
            if await self._wait(delay):
                failures = 0  # the endpoint came back: the schedule starts over, and this retry is immediate
                qs.last_revival_s = self._clock.time()
                qs.fire(Event.REACHABLE)
            else:
                qs.fire(Event.RETRY_DUE)
            pending = still

    async def _wait(self, delay_s: float) -> bool:
        """Wait ``delay_s`` on the clock; return True if cut short because the endpoint became reachable."""
        if self._reachable.is_set():
            self._reachable.clear()
            return True
        if delay_s <= 0:
            return False
        sleeper = asyncio.ensure_future(self._clock.sleep(delay_s))
        waker = asyncio.ensure_future(self._reachable.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()
        if self._reachable.is_set():
            self._reachable.clear()
            return True
        return False

    async def _dead_letter(self, q: QueueId, it: StoredItem, reason: str, error: str | None) -> None:
        attempts = self._attempts.pop((q, it.offset), 0) + (1 if reason == DeadLetterReason.INVALID else 0)
        await self._store.dead_letter(it, reason=reason, attempts=attempts, error=error)
        self._changed.set()

    async def _commit(self, q: QueueId, offset: int) -> None:
        qs = self._qs(q)
        cp = self._store.checkpoint(q)
        if (offset, qs.unhealthy_since_s, qs.last_revival_s) != (cp.committed, cp.unhealthy_since_s, cp.last_revival_s):
            await self._store.commit(
                q, offset, unhealthy_since_s=qs.unhealthy_since_s, last_revival_s=qs.last_revival_s
            )
        for key in [k for k in self._attempts if k[0] == q and k[1] <= offset]:
            del self._attempts[key]
        self._changed.set()

    # -- cleanup ------------------------------------------------------------------------------------------
    async def _cleanup_loop(self) -> None:
        while True:
            await self._clock.sleep(self._settings.cleanup_interval_s)
            try:
                await self.cleanup()
            except StoreClosedError:
                raise
            except StoreError as exc:  # a full disk: try again next interval
                log.warning("executor.cleanup_failed endpoint=%s error=%s", self._id, exc)

    async def cleanup(self) -> dict[RemovalReason, int]:
        """Remove delivered and expired references once; returns what was removed, by reason."""
        removed = {RemovalReason.DELIVERED: 0, RemovalReason.TTL: 0}
        now = self._clock.time()
        whole = self._settings.check_entire_queue_on_cleanup
        for q in self._store.queues(self._id):
            committed = self._store.checkpoint(q).committed
            start = 0
            while True:
                refs = self._store.references(q, start, 4096)
                delivered = [r.offset for r in refs if r.offset <= committed]
                expired: list[int] = []
                stop = False
                for r in refs:
                    if r.offset <= committed:
                        continue
                    if r.expires_at_s <= now:
                        expired.append(r.offset)
                    elif not whole:
                        stop = True
                        break
                if delivered:
                    removed[RemovalReason.DELIVERED] += await self._store.remove(q, delivered, RemovalReason.DELIVERED)
                if expired:
                    removed[RemovalReason.TTL] += await self._store.remove(q, expired, RemovalReason.TTL)
                if stop or len(refs) < 4096:
                    break
                start = refs[-1].offset + 1
        self.cleanups_run += 1
        self._changed.set()
        log.debug("executor.cleanup endpoint=%s delivered=%d ttl=%d", self._id, *removed.values())
        return removed
