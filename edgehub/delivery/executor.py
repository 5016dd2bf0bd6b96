"""One executor per endpoint: takes references from the endpoint's queues and hands batches to the endpoint.

Each queue (endpoint, priority) has its checkpointer, its state machine (``fsm``) and its retry state: the
references of a batch that failed (``pending``), how often it failed, and when it may be tried again.

Invariants:
* the pump serves the highest priority that is ready: a queue with new messages and nothing failed, or a
  failed queue whose retry is due. One priority per batch, and it chooses again from the top after every
  batch (a send that failed included), so a failed low-priority batch waiting out its retry delay never holds
  back a higher priority; with nothing ready it waits for new messages, a reachability report or the earliest
  retry time on the executor's clock;
* while a batch is in flight the pump reads the next batch of the same queue (prefetch); the next choice uses
  it only if it chose that queue again, and only what the checkpointer still admits;
* a reference whose TTL (fixed at enqueue) has passed is never sent: it is removed, counted as ``ttl``; that
  holds at read and again before every retry;
* a queue's checkpoint never moves past the first message still owed (``Checkpointer``);
* failed messages of a batch are retried in order, before anything later in that queue, under the retry
  policy; before a retry, references that expired are removed and references the store no longer holds
  (cleanup, ``discardOldest`` eviction) are dropped, and both count as done for the checkpoint. A message the
  endpoint calls invalid, or that failed ``max_delivery_attempts`` times, or whose retry policy ran out, goes
  to the dead-letter queue;
* a retry wait is cut short when the endpoint reports it is reachable, but only by a report that came after
  the failed send began (a stale report never shortens a later wait); that retry is immediate and the retry
  schedule starts over;
* while the endpoint reports it is unreachable (``ReportsUnreachable``) its queues are parked: nothing is
  sent until it reports reachable again or a retry delay has passed (for a failed batch its own retry time;
  for new messages the policy's first delay after the report, or the retry time of the last send made while
  parked). A send made while parked is a probe: its failure counts no attempt against
  ``max_delivery_attempts`` and never exhausts the retry policy (its wait is then the policy's maximum
  delay, and at most ``probe_interval_s`` after a probe refused at once: ``RetryPolicy.probe_delay_s``); a send
  that was in flight when the report came counts as usual (it may have reached the peer). A
  send that succeeds counts as a reachable report;
* a ``PipelinedEndpoint`` gets several batches at once: the pump waits until it ``has_room`` before each choice,
  ``submit``s the batch and chooses again; results are settled in submission order, each batch's result its own
  checkpoint (the checkpointer never commits past a batch still in flight). A queue with a batch in flight is
  SENDING; a failed batch makes it FAILING and the failures of its later batches still in flight join the
  retry (in queue order); a retry waits until the queue has nothing in flight, and newer messages may follow a
  retry on its way. A batch shorter than ``max_batch_messages`` waits up to the endpoint's ``linger_s`` for
  more while other batches are in flight, but only while nothing of lower priority is ready (else it goes
  first: lingering never lets a lower priority overtake);
* a queue whose priority the endpoint does not carry now (``CarriesPriorities``) is not chosen, new messages and
  retries alike, and counts no attempt; the endpoint's ``on_reachable`` makes the pump look again;
* the cleanup processor (``edgehub.delivery.cleanup``) removes delivered and expired references every
  ``cleanup_interval_s`` (head-only, or the whole queue with ``check_entire_queue_on_cleanup``); the store
  deletes a body with its last reference. The values and per-queue state live in ``executor_state``.

Use: ``async with EndpointExecutor(store, endpoint, ...) as ex: ...``; call ``ex.notify()`` after enqueueing to
one of its queues (the hub does, once ``store.admit_many``'s group write is durable).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

from edgehub.core import Clock, FailureKind, StoreClosedError, StoreError, SystemClock
from edgehub.core.expiry import has_expired
from edgehub.core.refusals import RateLimitedLog
from edgehub.delivery.cleanup import cleanup_loop, remove_delivered_and_expired
from edgehub.delivery.endpoint import (
    CarriesPriorities,
    Endpoint,
    PipelinedEndpoint,
    QueuedMessage,
    ReportsUnreachable,
    SendResult,
)
from edgehub.delivery.executor_state import DeadLetterReason, ExecutorSettings, SendStats, _InFlight, _QueueState
from edgehub.delivery.fsm import Event, State
from edgehub.delivery.retry import effective_policy
from edgehub.store import QueueId, RemovalReason, Store, StoredItem

__all__ = ["DeadLetterReason", "EndpointExecutor", "ExecutorSettings"]

log = logging.getLogger(__name__)

STORE_RETRY_S = 1.0  # after a store failure, the pump starts over this much later


class EndpointExecutor:
    """Delivers one endpoint's queues. See the module docstring."""

    def __init__(
        self, store: Store, endpoint: Endpoint, *, clock: Clock | None = None, settings: ExecutorSettings | None = None
    ) -> None:
        self._store = store
        self._endpoint = endpoint
        self._id = endpoint.endpoint_id
        self._clock: Clock = clock or SystemClock()
        # A module that connects and drops again and again, or fails every delivery, makes these lines as often
        # as it likes: each kind at most RateLimitedLog's burst a minute, then one with how many were held back.
        self._lines = RateLimitedLog(log, clock=self._clock)
        self._settings = settings or ExecutorSettings()
        self._policy = effective_policy(self._settings.retry_policy, self._settings.endpoint_retry_policy)
        self._queues: dict[QueueId, _QueueState] = {}
        self._wake = asyncio.Event()
        # Sends and reachability reports are numbered in the order they happen, so that a report can be told to
        # have come after a send began (the clock cannot: a manual one may not move in between).
        self._seq = 0
        self._reachable_seq = 0
        self._unreachable = False  # the endpoint's last report said so: its queues are parked
        self._park_until_mono_s = 0.0  # while parked, new messages may be tried (a probe) from then on
        self._idling = False
        self.idle_waits = 0  # times the pump found nothing ready and waited
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pipelined: PipelinedEndpoint | None = endpoint if isinstance(endpoint, PipelinedEndpoint) else None
        self._gate: CarriesPriorities | None = endpoint if isinstance(endpoint, CarriesPriorities) else None
        self._inflight: deque[_InFlight] = deque()
        self.sends = SendStats()  # batches, messages acknowledged and send time: per batch settled
        self.batches_prefetched = 0  # batches read while the one before was in flight
        self.cleanups_run = 0
        self._changed = asyncio.Event()  # set after every send, commit, dead letter, prefetch and cleanup
        endpoint.bind(self._on_reachable)
        if isinstance(endpoint, ReportsUnreachable):
            endpoint.bind_unreachable(self._on_unreachable)

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        self._tasks = [
            self._tg.create_task(self._pump(), name=f"executor.pump:{self._id}"),
            self._tg.create_task(
                cleanup_loop(self._clock, lambda: self._settings.cleanup_interval_s, self.cleanup, self._id),
                name=f"executor.cleanup:{self._id}",
            ),
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

    @property
    def settings(self) -> ExecutorSettings:
        return self._settings

    def reconfigure(self, settings: ExecutorSettings) -> None:
        """Take ``settings`` while running (a deployment update): the retry policy and ``max_delivery_attempts``
        apply from the next failure on (a retry already scheduled keeps its time), cleanup from its next run."""
        self._settings = settings
        self._policy = effective_policy(settings.retry_policy, settings.endpoint_retry_policy)
        self._wake.set()

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _on_reachable(self) -> None:
        if self._unreachable:
            self._lines.line("reachable", "executor.reachable", endpoint=self._id)
        self._unreachable = False
        self._reachable_seq = self._next_seq()
        self._wake.set()

    def _on_unreachable(self) -> None:
        if not self._unreachable:
            self._unreachable = True
            delay_s = self._probe_delay_s(1)
            self._park_until_mono_s = self._clock.monotonic() + delay_s
            self._lines.line("unreachable", "executor.unreachable", endpoint=self._id, parked_for_s=delay_s)
        self._wake.set()

    @property
    def reachable(self) -> bool:
        """False while the endpoint's last report said it is unreachable (its queues are parked)."""
        return not self._unreachable

    def _probe_delay_s(self, failures: int, kind: FailureKind | None = None) -> float:
        """The wait before trying a parked endpoint again (``RetryPolicy.probe_delay_s``): never runs out, and
        stays short for probes refused at once."""
        return self._policy.probe_delay_s(failures, kind)

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, checked after each send, commit, dead letter, prefetch and cleanup.
        Bound it with ``asyncio.timeout``: meant for tests and tools that wait for progress."""
        while not condition():
            self._changed.clear()
            await self._changed.wait()

    async def wait_idle(self) -> None:
        """Return once the pump has dealt with every ``notify`` and reachability report made before this call and
        found nothing ready: it waits for new messages, a report or a retry time. Bound it with
        ``asyncio.timeout``: meant for tests that check what was *not* sent. (The pump's clock sleep may start a
        moment later: with a manual clock, ``wait_for_sleepers`` before ``advance``.)"""
        seen = self.idle_waits
        busy = self._wake.is_set() or not self._idling
        await self.wait_for(lambda: not busy or self.idle_waits > seen)

    def state(self, priority: int) -> State:
        qs = self._queues.get(QueueId(self._id, priority))
        return qs.state if qs else State.IDLE

    def in_flight(self, priority: int) -> tuple[int, int]:
        """For status: (messages of the priority's queue submitted to a pipelined endpoint and not yet settled,
        messages of a failed batch waiting for their retry). A walk over the batches in flight."""
        qs = self._queues.get(QueueId(self._id, priority))
        if qs is None:
            return 0, 0
        return sum(len(f.items) for f in self._inflight if f.qs is qs), len(qs.pending)

    def _qs(self, q: QueueId) -> _QueueState:
        qs = self._queues.get(q)
        if qs is None:
            cp = self._store.checkpoint(q)
            qs = self._queues[q] = _QueueState(cp.committed, cp.unhealthy_since_s, cp.last_revival_s)
        return qs

    # -- choosing -----------------------------------------------------------------------------------------
    def _revived(self, qs: _QueueState) -> bool:
        """Whether the endpoint is reachable by a report that came after the failed send of ``qs`` began."""
        return not self._unreachable and self._reachable_seq > qs.failed_send_seq

    def _retry_due(self, qs: _QueueState, now_mono: float) -> bool:
        return self._revived(qs) or qs.retry_at_mono_s <= now_mono

    def _has_new(self, q: QueueId, qs: _QueueState) -> bool:
        return self._store.end_offset(q) > qs.cursor

    def _may_send_new(self, now_mono: float) -> bool:
        return not self._unreachable or self._park_until_mono_s <= now_mono

    def _choose(self) -> tuple[QueueId, bool] | None:
        """The queue to serve next, highest priority first, and whether it is a retry; None: nothing is ready."""
        now = self._clock.monotonic()
        lingering: QueueId | None = None  # the first short batch waiting to fill: it goes before anything lower
        for q in self._store.queues(self._id):  # highest priority first
            if not self._carried(q):
                continue  # the endpoint cannot take this priority now: it waits (on_reachable wakes us)
            qs = self._qs(q)
            if qs.pending:
                if not qs.inflight and self._retry_due(qs, now):
                    return (lingering, False) if lingering is not None else (q, True)
            elif self._has_new(q, qs) and self._may_send_new(now):
                if not self._lingers(q, qs, now):
                    return (lingering or q), False
                lingering = lingering or q
        return None

    def _carried(self, q: QueueId) -> bool:
        return self._gate is None or self._gate.carries(q.priority)

    def _lingers(self, q: QueueId, qs: _QueueState, now_mono: float) -> bool:
        """Whether a short batch of ``q`` should wait for more (only while other batches are in flight)."""
        if self._pipelined is None or not self._inflight or self._pipelined.linger_s <= 0:
            qs.linger_until_mono_s = None
            return False
        if self._store.end_offset(q) - qs.cursor >= self._endpoint.max_batch_messages:
            return False
        if qs.linger_until_mono_s is None:
            qs.linger_until_mono_s = now_mono + self._pipelined.linger_s
        return now_mono < qs.linger_until_mono_s

    def _next_deadline(self) -> float | None:
        """The earliest time (monotonic) at which a queue becomes ready without a signal, or None."""
        # A queue with a batch in flight becomes ready when that batch settles, which wakes the pump.
        # A queue whose priority the endpoint does not carry now has no time of its own: on_reachable wakes it
        # (its retry time may have passed: counting it would spin the pump).
        queues = {q: qs for q, qs in self._queues.items() if self._carried(q)}
        times = [qs.retry_at_mono_s for qs in queues.values() if qs.pending and not qs.inflight]
        # A linger time only while it is ahead: one that passed while its queue could not send (parked) is no
        # reason to wake, and would spin the pump.
        now = self._clock.monotonic()
        times += [t for qs in queues.values() if (t := qs.linger_until_mono_s) is not None and t > now]
        if self._unreachable and any(not qs.pending and self._has_new(q, qs) for q, qs in queues.items()):
            times.append(self._park_until_mono_s)
        return min(times, default=None)

    async def _idle(self, *, until_woken: bool = False) -> None:
        """Wait for new messages, a reachability report, a settled batch, or the earliest retry time (not that
        with ``until_woken``)."""
        deadline = None if until_woken else self._next_deadline()
        delay_s = None if deadline is None else deadline - self._clock.monotonic()
        if delay_s is not None and delay_s <= 0:  # due already (a clock that woke a hair early): choose again
            await asyncio.sleep(0)
            return
        self._idling = True
        self.idle_waits += 1
        self._changed.set()
        try:
            if delay_s is None:
                await self._wake.wait()
                return
            sleeper = asyncio.ensure_future(self._clock.sleep(delay_s))
            waker = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()
        finally:
            self._idling = False

    # -- pump ---------------------------------------------------------------------------------------------
    def _read(self, q: QueueId, from_offset: int) -> list[StoredItem]:
        return self._store.read(q, from_offset, self._endpoint.max_batch_messages)

    async def _prefetch(self, q: QueueId, from_offset: int) -> list[StoredItem]:
        # From memory on the loop when the store holds them (the executor keeps up: the usual case); a thread
        # only for a database read, whose decoding would hold the loop (a thread hop cost more than the read).
        items, start, more = self._store.read_start(q, from_offset, self._endpoint.max_batch_messages)
        if more:  # the store's state is read here, on the loop; the worker thread touches only the database
            items += await asyncio.to_thread(self._store.read_durable, q, start, more)
        if items:
            self.batches_prefetched += 1
            self._changed.set()
        return items

    async def _pump(self) -> None:
        """Run the pump; a store failure (a full disk) is logged, the in-memory queue state is rebuilt from the
        committed checkpoints (at-least-once: what was in flight or waiting for a retry is sent again) and the
        pump starts over."""
        while True:
            try:
                await self._pump_once()
            except StoreClosedError:
                raise
            except StoreError as exc:
                log.warning("executor.store_failed endpoint=%s error=%s retry_in_s=%s", self._id, exc, STORE_RETRY_S)
                self._queues.clear()
                self._inflight.clear()  # their results are not awaited: what they carried is sent again
                await self._clock.sleep(STORE_RETRY_S)

    async def _pump_once(self) -> None:
        prefetch: tuple[QueueId, asyncio.Task[list[StoredItem]]] | None = None
        try:
            while True:
                self._wake.clear()  # before choosing: a notify (or a settled batch) from here on wakes the wait below
                await self._settle_finished()
                if self._pipelined is not None and self._inflight and not self._pipelined.has_room:
                    await self._idle(until_woken=True)  # choose once the batch can go at once: a settled batch wakes
                    continue
                choice = self._choose()
                if prefetch is not None and choice != (prefetch[0], False):  # the next batch is not the prefetched one
                    prefetch[1].cancel()
                    prefetch = None
                if choice is None:
                    await self._idle()
                    continue
                q, retry = choice
                qs = self._qs(q)
                if retry:
                    await self._retry(q, qs)
                    continue
                raw: list[StoredItem] = []
                if prefetch is not None:
                    raw = [it for it in await prefetch[1] if qs.checkpointer.admit(it.offset)]  # stale ones dropped
                    prefetch = None
                if not raw:  # nothing prefetched, or read before new arrivals: read now
                    raw = [it for it in self._read(q, qs.cursor) if qs.checkpointer.admit(it.offset)]
                if not raw:
                    # references were removed under the cursor (cleanup); skip to the end of the queue
                    qs.cursor = max(qs.cursor, self._store.end_offset(q))
                    continue
                items = await self._take_batch(q, qs, raw)
                if not items:
                    continue
                task = asyncio.create_task(self._prefetch(q, qs.cursor), name=f"executor.prefetch:{q}")
                task.add_done_callback(lambda t: t.cancelled() or t.exception())  # dropped ones: nobody awaits
                prefetch = (q, task)
                qs.linger_until_mono_s = None
                if qs.state is not State.SENDING:  # SENDING: a pipelined endpoint has batches of it in flight
                    qs.fire(Event.BATCH)
                await self._attempt(q, qs, items)
        finally:
            if prefetch is not None:
                prefetch[1].cancel()

    async def _take_batch(self, q: QueueId, qs: _QueueState, items: list[StoredItem]) -> list[StoredItem]:
        """Advance the cursor past ``items`` and propose them; drop (and remove) the expired ones."""
        qs.cursor = items[-1].offset + 1
        qs.checkpointer.propose([it.offset for it in items])
        now = self._clock.time()
        expired = [it.offset for it in items if has_expired(it, now)]
        if not expired:
            return items
        await self._store.remove(q, expired, RemovalReason.TTL)
        await self._commit(q, qs.checkpointer.commit(expired))
        return [it for it in items if not has_expired(it, now)]

    def _held(self, q: QueueId, items: Sequence[StoredItem]) -> set[int]:
        """The offsets of ``items`` (in queue order) whose references the store still holds."""
        if not items:
            return set()
        lo, hi = items[0].offset, items[-1].offset
        return {r.offset for r in self._store.references(q, lo, hi - lo + 1) if r.offset <= hi}

    async def _retry(self, q: QueueId, qs: _QueueState) -> None:
        """Send the failed batch of ``q`` again, without what expired or left the store meanwhile."""
        revived = self._revived(qs)
        now = self._clock.time()
        expired = [it.offset for it in qs.pending if has_expired(it, now)]
        live = [it for it in qs.pending if not has_expired(it, now)]
        held = self._held(q, live)
        gone = [it.offset for it in live if it.offset not in held]  # removed by cleanup or eviction: counted there
        live = [it for it in live if it.offset in held]
        if expired:
            await self._store.remove(q, expired, RemovalReason.TTL)
        if expired or gone:
            self._lines.line(
                "retry_dropped",
                "executor.retry_dropped",
                endpoint=self._id,
                priority=q.priority,
                expired=len(expired),
                gone=len(gone),
            )
        if not live:
            qs.clear_retry()
            qs.fire(Event.GIVE_UP)
            await self._commit(q, qs.checkpointer.commit([*expired, *gone]))
            qs.fire(Event.COMMITTED)
            return
        if expired or gone:
            await self._commit(q, qs.checkpointer.commit([*expired, *gone], [it.offset for it in live]))
        if revived:
            qs.failures = 0  # the endpoint came back: the schedule starts over, and this retry is immediate
            qs.last_revival_s = now
            qs.fire(Event.REACHABLE)
        else:
            qs.fire(Event.RETRY_DUE)
        # On its way again: no longer waiting. (Its failures still count until it succeeds.) With a pipelined
        # endpoint, newer messages of the queue may follow it at once; if it fails, they join its retry.
        qs.pending = []
        await self._attempt(q, qs, live)

    def _batch(self, q: QueueId, qs: _QueueState, items: Sequence[StoredItem]) -> list[QueuedMessage]:
        return [
            QueuedMessage(it.message, it.offset, q.priority, it.enqueued_at_s, it.ttl_s, qs.attempts.get(it.offset, 0))
            for it in items
        ]

    async def _submit(
        self, endpoint: PipelinedEndpoint, q: QueueId, qs: _QueueState, items: Sequence[StoredItem]
    ) -> asyncio.Future[SendResult]:
        batch = self._batch(q, qs, items)
        try:
            return await endpoint.submit(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("endpoint.submit_raised endpoint=%s error=%s", self._id, exc)
            failed: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
            failed.set_result(SendResult.all_failed(batch, FailureKind.TRANSIENT, str(exc)))
            return failed

    async def _settle_finished(self) -> None:
        """Settle the submitted batches whose results are in, in submission order."""
        while self._inflight and self._inflight[0].result.done():
            f = self._inflight.popleft()
            f.qs.inflight -= 1
            if f.result.cancelled() or f.result.exception() is not None:
                error = "cancelled" if f.result.cancelled() else str(f.result.exception())
                log.warning("endpoint.send_raised endpoint=%s error=%s", self._id, error)
                result = SendResult.all_failed(self._batch(f.q, f.qs, f.items), FailureKind.TRANSIENT, error)
            else:
                result = f.result.result()
            self.sends.settled(result, self._clock.monotonic() - f.started_mono_s)
            self._changed.set()
            if self._queues.get(f.q) is f.qs:  # else the queue state was rebuilt after a store failure
                await self._settle(f.q, f.qs, f.items, result, f.seq, f.probe)

    async def _send(self, q: QueueId, qs: _QueueState, items: Sequence[StoredItem]) -> SendResult:
        batch = self._batch(q, qs, items)
        started = self._clock.monotonic()
        try:
            result = await self._endpoint.send(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("endpoint.send_raised endpoint=%s error=%s", self._id, exc)
            result = SendResult.all_failed(batch, FailureKind.TRANSIENT, str(exc))
        self.sends.settled(result, self._clock.monotonic() - started)
        self._changed.set()
        return result

    async def _attempt(self, q: QueueId, qs: _QueueState, items: list[StoredItem]) -> None:
        """Send ``items`` once (the queue is SENDING). On success commit; on failure record the retry state and
        return (FAILING): the pump chooses again. A pipelined endpoint gets the batch submitted; it is settled
        once its result is in."""
        seq = self._next_seq()
        probe = self._unreachable  # parked: this send only finds out whether the endpoint is back
        if self._pipelined is not None:
            started = self._clock.monotonic()
            fut = await self._submit(self._pipelined, q, qs, items)
            qs.inflight += 1
            self._inflight.append(_InFlight(q, qs, items, seq, probe, fut, started))
            fut.add_done_callback(lambda _: self._wake.set())
            return
        result = await self._send(q, qs, items)
        await self._settle(q, qs, items, result, seq, probe)

    async def _settle(
        self, q: QueueId, qs: _QueueState, items: list[StoredItem], result: SendResult, seq: int, probe: bool
    ) -> None:
        """Sort the result of one send of ``items``: commit what is done, dead-letter what must be, keep the rest
        for a retry. With a pipelined endpoint other batches of ``q`` may still be in flight: SENDING then holds
        until the last of them is settled, and a failure joins the retry of an earlier failed batch."""
        by_offset = {it.offset: it for it in items}
        ok = {m.offset for m in result.succeeded} & by_offset.keys()
        invalid = {m.offset for m in result.invalid} & by_offset.keys() - ok
        failed = [it for it in items if it.offset not in ok and it.offset not in invalid]
        done = set(ok)
        for off in sorted(invalid):
            why = result.invalid_errors.get(off, result.error)
            await self._dead_letter(qs, by_offset[off], DeadLetterReason.INVALID, why)
            done.add(off)
        if result.succeeded and self._unreachable:
            self._on_reachable()  # it delivered: whatever the last report said, the endpoint is back
        if qs.state is State.IDLE:  # a batch that was in flight when an earlier one gave up
            qs.fire(Event.BATCH)
        if not failed:
            if qs.state is not State.SENDING or qs.inflight:  # a retry pending, or more of the queue in flight
                if qs.state is State.SENDING:  # nothing of the queue failed since: healthy, schedule starts over
                    qs.unhealthy_since_s = None
                    qs.failures = 0
                await self._commit(q, qs.checkpointer.commit(done))
                return
            qs.clear_retry()
            qs.fire(Event.SENT_OK)
            qs.unhealthy_since_s = None
            await self._commit(q, qs.checkpointer.commit(done))
            qs.fire(Event.COMMITTED)
            return
        joining = qs.state is not State.SENDING  # an earlier batch of the queue failed: these join its retry
        if not joining:
            qs.fire(Event.SENT_FAILED)
            qs.failures += 1
            qs.failed_send_seq = seq
        now = self._clock.time()
        if qs.unhealthy_since_s is None:
            qs.unhealthy_since_s = now
        kind = result.failure_kind or FailureKind.TRANSIENT
        delay_s = self._probe_delay_s(qs.failures, kind) if probe else self._policy.delay_s(qs.failures)
        # A probe refused at once comes every second or so through an outage: not a line each at INFO.
        quiet = probe and kind is FailureKind.TRANSIENT
        if quiet:
            log.debug("endpoint.send_failed endpoint=%s priority=%d kind=%s", self._id, q.priority, kind)
        else:
            self._lines.line(
                "send_failed",
                "endpoint.send_failed",
                endpoint=self._id,
                priority=q.priority,
                failed=len(failed),
                kind=kind,
                retry_in_s=delay_s,
            )
        still: list[StoredItem] = []
        limit = self._settings.max_delivery_attempts
        for it in failed:
            n = qs.attempts.get(it.offset, 0) + (0 if probe else 1)
            if n:
                qs.attempts[it.offset] = n
            if limit is not None and n >= limit:
                await self._dead_letter(qs, it, DeadLetterReason.MAX_DELIVERY_ATTEMPTS, result.error)
                done.add(it.offset)
            elif has_expired(it, now):
                await self._store.remove(q, [it.offset], RemovalReason.TTL)
                done.add(it.offset)
            else:
                still.append(it)
        if still and delay_s is None:
            for it in still:
                await self._dead_letter(qs, it, DeadLetterReason.RETRY_EXHAUSTED, result.error)
                done.add(it.offset)
            still = []
        await self._commit(q, qs.checkpointer.commit(done, [it.offset for it in still]))
        if joining:
            qs.pending = sorted([*qs.pending, *still], key=lambda it: it.offset)
            return
        if not still:
            qs.clear_retry()
            qs.fire(Event.GIVE_UP)
            qs.fire(Event.COMMITTED)
            return
        assert delay_s is not None
        qs.pending = still
        qs.retry_at_mono_s = self._clock.monotonic() + delay_s
        if self._unreachable:  # new messages of other queues wait as long: one probe at a time
            self._park_until_mono_s = max(self._park_until_mono_s, qs.retry_at_mono_s)
        if now - qs.unhealthy_since_s >= self._settings.unhealthy_after_s and qs.state is State.FAILING:
            qs.fire(Event.UNHEALTHY)

    async def _dead_letter(self, qs: _QueueState, it: StoredItem, reason: str, error: str | None) -> None:
        attempts = qs.attempts.pop(it.offset, 0) + (1 if reason == DeadLetterReason.INVALID else 0)
        await self._store.dead_letter(it, reason=reason, attempts=attempts, error=error)
        self._changed.set()

    async def _commit(self, q: QueueId, offset: int) -> None:
        qs = self._qs(q)
        cp = self._store.checkpoint(q)
        if (offset, qs.unhealthy_since_s, qs.last_revival_s) != (cp.committed, cp.unhealthy_since_s, cp.last_revival_s):
            await self._store.commit(
                q, offset, unhealthy_since_s=qs.unhealthy_since_s, last_revival_s=qs.last_revival_s
            )
        for off in [o for o in qs.attempts if o <= offset]:
            del qs.attempts[off]
        self._changed.set()

    # -- cleanup ------------------------------------------------------------------------------------------
    async def cleanup(self) -> dict[RemovalReason, int]:
        """Remove delivered and expired references once; returns what was removed, by reason."""
        removed = await remove_delivered_and_expired(
            self._store, self._id, self._clock.time(), whole=self._settings.check_entire_queue_on_cleanup
        )
        self.cleanups_run += 1
        self._changed.set()
        log.debug("executor.cleanup endpoint=%s delivered=%d ttl=%d", self._id, *removed.values())
        return removed
