"""A clock that moves only when told to. ``advance()`` wakes, in deadline order, every sleeper due."""

from __future__ import annotations

import asyncio
import heapq
import itertools

__all__ = ["ManualClock"]


class ManualClock:
    """Implements ``edgehub.core.Clock``. Starts at ``start`` epoch seconds; ``monotonic`` moves with it."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._start = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._sleep_started: asyncio.Event | None = None

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now - self._start

    async def sleep(self, delay_s: float) -> None:
        if delay_s <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + delay_s, next(self._seq), fut))
        if self._sleep_started is not None:
            self._sleep_started.set()
        await fut

    @property
    def sleepers(self) -> int:
        """How many sleeps are pending (not yet woken or cancelled)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def wait_for_sleepers(self, count: int = 1) -> None:
        """Return once at least ``count`` sleeps are pending. Bound it with ``asyncio.timeout``."""
        while self.sleepers < count:
            self._sleep_started = asyncio.Event()
            await self._sleep_started.wait()

    def next_deadline(self) -> float | None:
        """The earliest pending sleep's deadline, or None."""
        live = [d for d, _, f in self._sleepers if not f.done()]
        return min(live) if live else None

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has come."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)
