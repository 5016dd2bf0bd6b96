"""Test endpoints: complete implementations of ``edgehub.delivery.Endpoint`` that a test steers.

``TestEndpoint`` records every delivered message (``delivered``, in delivery order, and ``batches``) and can be
told to fail the next N sends (``fail_next``), to call some messages invalid (``reject_when``), to stall until
released (``stall`` / ``release``), or to be unreachable until revived (``go_down`` / ``revive``: revive calls the
executor's ``on_reachable``; ``go_down(report=True)`` calls its ``on_unreachable`` too, as a transport that
notices its link drop would, while plain ``go_down()`` just fails every send; ``revive(report=False)`` comes
back without a word). ``wait_delivered(n)`` and ``wait_sends(n)`` wait for progress (bound them with
``asyncio.timeout``). ``NullEndpoint`` takes everything and keeps only a count (benchmarks).
``PipelinedTestEndpoint`` is a ``PipelinedEndpoint`` with a window of ``window`` batches: every submitted batch
waits until the test acks or fails it (``ack``, ``fail``, ``lose_link``), as a link with a long round trip would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence

from edgehub.core import FailureKind, Message
from edgehub.delivery.endpoint import QueuedMessage, SendResult

__all__ = ["GatedTestEndpoint", "NullEndpoint", "PipelinedTestEndpoint", "TestEndpoint"]


class TestEndpoint:
    __test__ = False  # not a pytest class

    def __init__(self, endpoint_id: str = "test", *, max_batch_messages: int = 10) -> None:
        self._id = endpoint_id
        self._max = max_batch_messages
        self.delivered: list[QueuedMessage] = []
        self.batches: list[list[QueuedMessage]] = []
        self.sends = 0
        self._fail_left = 0
        self._fail_kind = FailureKind.TRANSIENT
        self._down = False
        self._invalid: Callable[[Message], bool] = lambda _m: False
        self._gate = asyncio.Event()
        self._gate.set()
        self._stalled = asyncio.Event()
        self._progress = asyncio.Event()
        self._on_reachable: Callable[[], None] | None = None
        self._on_unreachable: Callable[[], None] | None = None
        self.closed = False

    # -- the Endpoint protocol ----------------------------------------------------------------------------
    @property
    def endpoint_id(self) -> str:
        return self._id

    @property
    def max_batch_messages(self) -> int:
        return self._max

    def bind(self, on_reachable: Callable[[], None]) -> None:
        self._on_reachable = on_reachable

    def bind_unreachable(self, on_unreachable: Callable[[], None]) -> None:
        self._on_unreachable = on_unreachable

    async def send(self, batch: Sequence[QueuedMessage]) -> SendResult:
        self.sends += 1
        try:
            if not self._gate.is_set():
                self._stalled.set()
                await self._gate.wait()
            if self._down or self._fail_left > 0:
                self._fail_left = max(0, self._fail_left - 1)
                return SendResult.all_failed(batch, self._fail_kind, "test endpoint told to fail")
            invalid = [m for m in batch if self._invalid(m.message)]
            ok = [m for m in batch if not self._invalid(m.message)]
            self.delivered.extend(ok)
            self.batches.append(list(batch))
            return SendResult(
                succeeded=ok,
                invalid=invalid,
                failure_kind=FailureKind.INVALID_INPUT if invalid else None,
                error="rejected by test endpoint" if invalid else None,
            )
        finally:
            self._progress.set()

    async def close(self) -> None:
        self.closed = True

    # -- steering -----------------------------------------------------------------------------------------
    def fail_next(self, n: int, kind: FailureKind = FailureKind.TRANSIENT) -> None:
        self._fail_left = n
        self._fail_kind = kind

    def reject_when(self, predicate: Callable[[Message], bool]) -> None:
        self._invalid = predicate

    def go_down(self, *, report: bool = False) -> None:
        """Fail every send from now on; with ``report``, also tell the executor it is unreachable."""
        self._down = True
        if report and self._on_unreachable is not None:
            self._on_unreachable()

    def revive(self, *, report: bool = True) -> None:
        """Become reachable and (unless ``report`` is False) tell the executor, as a link coming up would."""
        self._down = False
        if report and self._on_reachable is not None:
            self._on_reachable()

    def stall(self) -> None:
        self._stalled.clear()
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    async def wait_stalled(self) -> None:
        await self._stalled.wait()

    async def wait_delivered(self, n: int) -> None:
        while len(self.delivered) < n:
            self._progress.clear()
            await self._progress.wait()

    async def wait_sends(self, n: int) -> None:
        while self.sends < n:
            self._progress.clear()
            await self._progress.wait()


class GatedTestEndpoint(TestEndpoint):
    """A ``TestEndpoint`` that carries only some priorities at a time (``CarriesPriorities``), as an upstream over
    several links does; ``carry(...)`` changes them and reports reachable, as a link coming up would."""

    def __init__(self, endpoint_id: str = "test", *, carried: Iterable[int] = (), max_batch_messages: int = 10) -> None:
        super().__init__(endpoint_id, max_batch_messages=max_batch_messages)
        self.carried = frozenset(carried)
        self.asked = 0  # carries() calls: the executor asks at every choice

    def carries(self, priority: int) -> bool:
        self.asked += 1
        return priority in self.carried

    def carry(self, priorities: Iterable[int]) -> None:
        self.carried = frozenset(priorities)
        self.revive()


class NullEndpoint:
    """Takes every batch at once; counts messages. ``wait_delivered(n)`` as in ``TestEndpoint``."""

    def __init__(self, endpoint_id: str = "null", *, max_batch_messages: int = 500) -> None:
        self._id = endpoint_id
        self._max = max_batch_messages
        self.count = 0
        self._progress = asyncio.Event()

    @property
    def endpoint_id(self) -> str:
        return self._id

    @property
    def max_batch_messages(self) -> int:
        return self._max

    def bind(self, on_reachable: Callable[[], None]) -> None:
        pass

    async def send(self, batch: Sequence[QueuedMessage]) -> SendResult:
        self.count += len(batch)
        self._progress.set()
        return SendResult(succeeded=batch)

    async def close(self) -> None:
        pass

    async def wait_delivered(self, n: int) -> None:
        while self.count < n:
            self._progress.clear()
            await self._progress.wait()


class PipelinedTestEndpoint:
    """Takes up to ``window`` batches at once; each stays in flight until the test settles it.

    ``submitted`` holds every batch in submission order; ``ack(i)`` / ``fail(i)`` settle batch ``i`` (an index
    into ``submitted``); ``lose_link()`` fails every batch in flight and reports unreachable; ``revive()`` reports
    reachable. ``send`` submits and waits. ``wait_submitted(n)`` waits until ``n`` batches were submitted."""

    __test__ = False

    def __init__(
        self, endpoint_id: str = "test", *, window: int = 3, max_batch_messages: int = 10, linger_s: float = 0.0
    ) -> None:
        self._id = endpoint_id
        self._max = max_batch_messages
        self.window = window
        self._linger_s = linger_s
        self.submitted: list[list[QueuedMessage]] = []
        self._results: list[asyncio.Future[SendResult]] = []
        self._progress = asyncio.Event()
        self._on_reachable: Callable[[], None] = lambda: None
        self._on_unreachable: Callable[[], None] = lambda: None
        self.down = False
        self.closed = False

    @property
    def endpoint_id(self) -> str:
        return self._id

    @property
    def max_batch_messages(self) -> int:
        return self._max

    @property
    def linger_s(self) -> float:
        return self._linger_s

    @property
    def in_flight(self) -> list[int]:
        """Indexes of the batches submitted and not settled yet."""
        return [i for i, f in enumerate(self._results) if not f.done()]

    def bind(self, on_reachable: Callable[[], None]) -> None:
        self._on_reachable = on_reachable

    def bind_unreachable(self, on_unreachable: Callable[[], None]) -> None:
        self._on_unreachable = on_unreachable

    @property
    def has_room(self) -> bool:
        return self.down or len(self.in_flight) < self.window

    async def submit(self, batch: Sequence[QueuedMessage]) -> asyncio.Future[SendResult]:
        fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        self.submitted.append(list(batch))
        self._results.append(fut)
        if self.down:
            fut.set_result(SendResult.all_failed(batch, FailureKind.TRANSIENT, "link down"))
        self._progress.set()
        return fut

    async def send(self, batch: Sequence[QueuedMessage]) -> SendResult:
        return await (await self.submit(batch))

    async def close(self) -> None:
        self.closed = True

    def ack(self, i: int) -> None:
        self._results[i].set_result(SendResult.all_succeeded(self.submitted[i]))
        self._progress.set()

    def fail(self, i: int, kind: FailureKind = FailureKind.TRANSIENT) -> None:
        self._results[i].set_result(SendResult.all_failed(self.submitted[i], kind, "test endpoint told to fail"))
        self._progress.set()

    def lose_link(self) -> None:
        self.down = True
        for i in self.in_flight:
            self.fail(i)
        self._on_unreachable()

    def revive(self) -> None:
        self.down = False
        self._on_reachable()
        self._progress.set()

    async def wait_submitted(self, n: int) -> None:
        while len(self.submitted) < n:
            self._progress.clear()
            await self._progress.wait()
