"""Several uplinks for one upstream lane (``upstream.links`` in the manifest): ``LinkedUpstream`` is the lane's
endpoint, and sends each batch over the most preferred link that may take it now.

A link is a transport the hub already has (``MqttUpstream`` with its own ``MqttUpstreamSettings``, whatever those
carry: TLS, WebSockets, a proxy; or an ``UploadTransport``) with a name, a cost per MiB, optional byte budgets
(a day's, a month's or both: ``edgehub.upstream.budget``), the priorities it may carry and those it may carry past
its budgets.

Which link a batch takes (``choose``)
-------------------------------------
Links are preferred cheapest first, then in the order given. A batch of priority P goes over the first link that

* is **up**: its connection is up (a transport without one, an upload, is up unless its last write failed, and
  is tried again 2 s after);
* may carry **P**;
* is **within its budgets** this period (each of them), or lets P past them (``allowedOverBudget``: the alarms);
* is **settled**: after it was lost, it has stayed up for ``settle_s`` (no flapping back and forth) -- unless no
  settled link may take P at all, then an unsettled one does (waiting would help nobody).

No link may take P: the executor leaves P's queue alone (``carries``, ``edgehub.delivery.CarriesPriorities``), its
messages wait in the store with their TTLs running, and the executor is woken when that changes.

Failover
--------
A link that fails (its connection refused, reset, or silent past its keepalive or ack timeout) fails the batches
in flight on it, as any loss does; the lane then reports itself reachable (another link is up), which the
executor takes as a reason to retry those batches at once, and they go over the next link. The far side may so
get a message twice (its PUBLISH got through, its PUBACK did not); segment records carry ``edge_message_id`` and
the Spark job drops duplicates by it. With no link up at all, the lane reports itself unreachable (parked).

Invariants: a batch goes over exactly one link per attempt; the bytes each link sent are counted in the ledger
(``BudgetLedger``) as they go, whatever became of the batch; a priority no link may carry is never handed to
``submit`` by an executor that asks ``carries`` (a submit that races a change fails TRANSIENT, as a send over a
link that just went down does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from edgehub.core import Clock, FailureKind, SystemClock
from edgehub.core.endpoints import UPSTREAM_ENDPOINT
from edgehub.core.priorities import ALL_PRIORITIES, format_priorities
from edgehub.delivery.endpoint import Endpoint, PipelinedEndpoint, QueuedMessage, ReportsUnreachable, SendResult
from edgehub.upstream.budget import (
    Budget,
    BudgetLedger,
    BudgetMark,
    Period,
    PeriodCount,
    binding,
    check_budgets,
    wire_bytes,
)
from edgehub.upstream.mqtt.settings import UpstreamStatus

__all__ = ["LinkSpec", "LinkState", "LinkStatus", "LinkedUpstream"]

log = logging.getLogger(__name__)

DEFAULT_SETTLE_S = 10.0
PROBE_AFTER_S = 2.0  # a link with no connection to watch (an upload) is tried again this long after a failure
WATCH_INTERVAL_S = 1.0  # how often budgets, periods and settle times are looked at (and the ledger written)


class LinkState(StrEnum):
    UP = "up"
    SETTLING = "settling"  # back after a loss, not yet up for settle_s: used only when nothing settled may be
    DOWN = "down"


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """What the manifest says of one link, its transport aside. Units are in the names."""

    name: str
    cost_per_mib: float = 0.0
    budgets: tuple[Budget, ...] = ()  # at most one per period, day first
    priorities: frozenset[int] = ALL_PRIORITIES
    over_budget: frozenset[int] = frozenset()  # may go on past 100 % of any of its budgets
    settle_s: float = DEFAULT_SETTLE_S
    tls: bool = False  # for the estimate of the bytes on the wire

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a link needs a name")
        if self.cost_per_mib < 0 or self.settle_s < 0:
            raise ValueError("cost_per_mib and settle_s must be >= 0")
        if not self.priorities:
            raise ValueError(f"link {self.name!r} carries no priority")
        if not self.over_budget <= self.priorities:
            raise ValueError(f"link {self.name!r}: allowedOverBudget must be among the priorities it carries")
        try:
            object.__setattr__(self, "budgets", check_budgets(self.budgets))
        except ValueError as exc:
            raise ValueError(f"link {self.name!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class LinkStatus:
    """One link as ``edgehub status``, the admin API and ``/metrics`` show it. ``periods``: its count in each period
    it is counted over (day first); the single figures below are those of the period that binds
    (``budget.binding``: the budget with the fewest bytes left; without a budget, the day's count)."""

    name: str
    state: LinkState
    preference: int  # 0 is tried first
    cost_per_mib: float
    periods: tuple[PeriodCount, ...]
    priorities: str  # what it may carry ("0-1")
    carries_now: str  # the priorities that would go over it now ("" for none)
    batches: int  # batches handed to it so far
    connects: int  # connections made (0 for a transport without one)

    @property
    def binding(self) -> PeriodCount:
        return binding(self.periods)

    @property
    def period(self) -> Period:
        return self.binding.period

    @property
    def period_start_s(self) -> float:
        return self.binding.period_start_s

    @property
    def bytes_this_period(self) -> int:
        """Counted on the wire (TCP/IP and TLS overhead estimated)."""
        return self.binding.bytes

    @property
    def cost_this_period(self) -> float:
        return self.binding.cost

    @property
    def budget_bytes(self) -> int | None:
        return self.binding.budget_bytes

    @property
    def budget_left_bytes(self) -> int | None:
        return self.binding.left_bytes

    @property
    def budget_mark(self) -> BudgetMark:
        return self.binding.mark


@runtime_checkable
class _ReportsConnected(Protocol):
    @property
    def connected(self) -> bool: ...


@runtime_checkable
class _Startable(Protocol):
    async def start(self) -> None: ...


@runtime_checkable
class _ReportsStatus(Protocol):
    def status(self) -> UpstreamStatus: ...


def _bytes_sent(transport: Endpoint) -> int:
    """What ``transport`` handed its socket or wrote so far: ``MqttUpstream.wire_bytes_sent``,
    ``UploadTransport.bytes_written``."""
    for name in ("wire_bytes_sent", "bytes_written"):
        value = getattr(transport, name, None)
        if isinstance(value, int):
            return value
    return 0


class _Link:
    def __init__(self, spec: LinkSpec, transport: Endpoint, order: int) -> None:
        self.spec = spec
        self.transport = transport
        self.order = order
        self.up_since_mono_s: float | None = None  # up since (None: down)
        self.ever_lost = False  # once lost, it must settle before it is preferred again
        self.failed_at_mono_s: float | None = None  # a transport without a connection: its last failure
        self.counted_bytes = 0  # its bytes already in the ledger
        self.batches = 0
        self.pipelined = transport if isinstance(transport, PipelinedEndpoint) else None


class LinkedUpstream:
    """One upstream lane over several links (see the module docstring). ``links`` in the manifest's order; the
    transports are started by ``start`` and closed by ``close``."""

    def __init__(
        self,
        links: Sequence[tuple[LinkSpec, Endpoint]],
        ledger: BudgetLedger,
        *,
        endpoint_id: str = UPSTREAM_ENDPOINT,
        clock: Clock | None = None,
    ) -> None:
        if not links:
            raise ValueError("LinkedUpstream needs at least one link")
        names = [spec.name for spec, _ in links]
        if len(set(names)) != len(names):
            raise ValueError(f"link names must differ: {names}")
        missing = set(names) - set(ledger.names())
        if missing:
            raise ValueError(f"the ledger does not count links {sorted(missing)}")
        self._id = endpoint_id
        self._clock = clock or SystemClock()
        self.ledger = ledger
        self._links = [_Link(spec, transport, i) for i, (spec, transport) in enumerate(links)]
        # Cheapest first, then the order given (sorted is stable).
        self._preferred = sorted(self._links, key=lambda link: link.spec.cost_per_mib)
        self._on_reachable: Callable[[], None] = lambda: None
        self._on_unreachable: Callable[[], None] = lambda: None
        self._watch: asyncio.Task[None] | None = None
        self._carried: tuple[str | None, ...] = ()
        self._changed = asyncio.Event()  # a link came up or went down
        for link in self._links:
            if not isinstance(link.transport, _ReportsConnected):
                link.up_since_mono_s = self._clock.monotonic()  # an upload is up until a write fails
            link.transport.bind(lambda link=link: self._link_up(link))  # type: ignore[misc]
            if isinstance(link.transport, ReportsUnreachable):
                link.transport.bind_unreachable(lambda link=link: self._link_down(link))  # type: ignore[misc]

    # -- Endpoint -----------------------------------------------------------------------------------------------

    @property
    def endpoint_id(self) -> str:
        return self._id

    @property
    def transports(self) -> tuple[Endpoint, ...]:
        """The links' transports, in the manifest's order."""
        return tuple(link.transport for link in self._links)

    @property
    def specs(self) -> tuple[LinkSpec, ...]:
        """The links' specs, in the manifest's order (as ``transports``)."""
        return tuple(link.spec for link in self._links)

    @property
    def max_batch_messages(self) -> int:
        """The batch of the most preferred link that is up: most batches go over it. (An MQTT link learns its
        batch from the bytes per message it sent; one that sent nothing yet asks for one message, which must not
        shrink the batches of the link that carries the traffic. A batch sized for one link that goes over
        another is cut into segments of that link's size anyway.)"""
        up = next((link for link in self._preferred if self._is_up(link)), self._preferred[0])
        return up.transport.max_batch_messages

    @property
    def linger_s(self) -> float:
        return min((link.pipelined.linger_s for link in self._links if link.pipelined is not None), default=0.0)

    @property
    def has_room(self) -> bool:
        """Every link that is up would take a batch at once (the batch's link is not known before it is chosen)."""
        return all(link.pipelined.has_room for link in self._links if link.pipelined is not None and self._is_up(link))

    @property
    def connected(self) -> bool:
        """Some link is up."""
        return any(self._is_up(link) for link in self._links)

    def bind(self, on_reachable: Callable[[], None]) -> None:
        self._on_reachable = on_reachable

    def bind_unreachable(self, on_unreachable: Callable[[], None]) -> None:
        self._on_unreachable = on_unreachable

    def carries(self, priority: int) -> bool:
        """Whether a batch of ``priority`` would go over some link now (``CarriesPriorities``)."""
        return self.choose(priority) is not None

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, checked whenever a link comes up or goes down and every second.
        Bound it with ``asyncio.timeout``: meant for tests and tools that watch the links."""
        while not condition():
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_INTERVAL_S):
                    await self._changed.wait()

    async def start(self) -> None:
        for link in self._links:
            if isinstance(link.transport, _Startable):
                await link.transport.start()
        if self._watch is None:
            self._carried = self._carriage()
            self._watch = asyncio.create_task(self._watch_loop(), name=f"upstream.links.{self._id}")

    async def __aenter__(self) -> LinkedUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        for link in self._links:
            await link.transport.close()
            self._count(link)
        self.ledger.flush()

    async def send(self, batch: Sequence[QueuedMessage]) -> SendResult:
        return await (await self.submit(batch))

    async def submit(self, batch: Sequence[QueuedMessage]) -> asyncio.Future[SendResult]:
        """Hand ``batch`` to the link ``choose`` names for its priority; fails TRANSIENT when none may take it."""
        done: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        if not batch:
            done.set_result(SendResult())
            return done
        priority = batch[0].priority
        link = self.choose(priority)
        if link is None:
            done.set_result(
                SendResult.all_failed(batch, FailureKind.TRANSIENT, f"no link may carry priority {priority} now")
            )
            return done
        link.batches += 1
        try:
            if link.pipelined is not None:
                return await link.pipelined.submit(batch)
            result = await link.transport.send(batch)
        finally:
            self._count(link)
        if result.failed and not isinstance(link.transport, _ReportsConnected):
            link.failed_at_mono_s = self._clock.monotonic()
        done.set_result(result)
        return done

    # -- choosing -----------------------------------------------------------------------------------------------

    def choose(self, priority: int) -> _Link | None:
        """The link a batch of ``priority`` goes over now, or None (see the module docstring)."""
        now = self._clock.monotonic()
        allowed = [link for link in self._preferred if self._may_take(link, priority)]
        for link in allowed:
            if self._settled(link, now):
                return link
        return allowed[0] if allowed else None

    def _may_take(self, link: _Link, priority: int) -> bool:
        spec = link.spec
        if priority not in spec.priorities or not self._is_up(link):
            return False
        return priority in spec.over_budget or not self.ledger.spent(spec.name)

    def _is_up(self, link: _Link) -> bool:
        if isinstance(link.transport, _ReportsConnected):
            return link.transport.connected
        failed = link.failed_at_mono_s
        return failed is None or self._clock.monotonic() - failed >= PROBE_AFTER_S

    def _settled(self, link: _Link, now_mono_s: float) -> bool:
        if not link.ever_lost:
            return True
        since = link.up_since_mono_s
        if since is None and link.failed_at_mono_s is not None:
            # No connection to watch (an upload): it counts as back from when it may be tried again, so a write
            # (the probe) tells; one that fails again starts the wait over.
            since = link.failed_at_mono_s + PROBE_AFTER_S
        return since is not None and now_mono_s - since >= link.spec.settle_s

    def _carriage(self) -> tuple[str | None, ...]:
        """The link each priority would take now: a change wakes the executor."""
        out = []
        for p in sorted(ALL_PRIORITIES):
            link = self.choose(p)
            out.append(link.spec.name if link is not None else None)
        return tuple(out)

    # -- what the links report ----------------------------------------------------------------------------------

    def _link_up(self, link: _Link) -> None:
        was_down = link.up_since_mono_s is None or link.failed_at_mono_s is not None
        link.failed_at_mono_s = None
        if link.up_since_mono_s is None:
            link.up_since_mono_s = self._clock.monotonic()
        if was_down:
            log.info(
                "link.up endpoint=%s link=%s settle_s=%s",
                self._id,
                link.spec.name,
                link.spec.settle_s if link.ever_lost else 0,
            )
        self._carried = self._carriage()
        self._changed.set()
        self._on_reachable()

    def _link_down(self, link: _Link) -> None:
        if link.up_since_mono_s is not None or not link.ever_lost:
            log.info("link.down endpoint=%s link=%s", self._id, link.spec.name)
        link.up_since_mono_s = None
        link.ever_lost = True
        if not isinstance(link.transport, _ReportsConnected):
            link.failed_at_mono_s = self._clock.monotonic()
        self._carried = self._carriage()
        self._changed.set()
        # Another link up: what failed on this one is retried at once over it. None: park the lane.
        if any(self._is_up(other) for other in self._links):
            self._on_reachable()
        else:
            self._on_unreachable()

    def _count(self, link: _Link) -> None:
        """Put the link's bytes sent since the last count in the ledger."""
        sent = _bytes_sent(link.transport)
        new = sent - link.counted_bytes
        if new > 0:
            link.counted_bytes = sent
            self.ledger.add(link.spec.name, wire_bytes(new, tls=link.spec.tls))

    async def _watch_loop(self) -> None:
        """Every second: count bytes sent outside ``submit`` (dictionaries), write the ledger when due, and wake
        the executor when the link a priority would take changed (a period began, a link settled)."""
        while True:
            await self._clock.sleep(WATCH_INTERVAL_S)
            for link in self._links:
                self._count(link)
            if self.ledger.flush_due():
                self.ledger.flush()
            carried = self._carriage()
            if carried != self._carried:
                self._carried = carried
                if any(name is not None for name in carried):
                    self._on_reachable()

    # -- status -------------------------------------------------------------------------------------------------

    def links_status(self) -> tuple[LinkStatus, ...]:
        """Every link, in the order of preference."""
        now = self._clock.monotonic()
        chosen = {p: self.choose(p) for p in sorted(ALL_PRIORITIES)}
        out = []
        for rank, link in enumerate(self._preferred):
            self._count(link)
            name = link.spec.name
            if not self._is_up(link):
                state = LinkState.DOWN
            elif self._settled(link, now):
                state = LinkState.UP
            else:
                state = LinkState.SETTLING
            transport = link.transport.status() if isinstance(link.transport, _ReportsStatus) else None
            out.append(
                LinkStatus(
                    name=name,
                    state=state,
                    preference=rank,
                    cost_per_mib=link.spec.cost_per_mib,
                    periods=self.ledger.counts(name),
                    priorities=format_priorities(link.spec.priorities),
                    carries_now=format_priorities(frozenset(p for p, c in chosen.items() if c is link)),
                    batches=link.batches,
                    connects=transport.connects if transport is not None else 0,
                )
            )
        return tuple(out)

    def status(self) -> UpstreamStatus:
        """The links' transports summed, as one lane's (connected when any link is)."""
        statuses = [link.transport.status() for link in self._links if isinstance(link.transport, _ReportsStatus)]
        return UpstreamStatus.summed(statuses, connected=self.connected)
