"""Time, behind a seam so that tests can steer it (``edgehub.testing.ManualClock``).

``time()`` is wall-clock epoch seconds (enqueue times, TTLs); ``monotonic()`` measures intervals;
``sleep()`` waits on this clock, so a manual clock's ``advance()`` wakes sleepers deterministically.
"""

from __future__ import annotations

import asyncio
import time as _time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "utc_from_epoch"]


@runtime_checkable
class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    async def sleep(self, delay_s: float) -> None:
        """Wait ``delay_s`` seconds of this clock. Cancellable."""
        ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    async def sleep(self, delay_s: float) -> None:
        await asyncio.sleep(max(0.0, delay_s))


def utc_from_epoch(epoch_s: float) -> datetime:
    """An aware UTC datetime from epoch seconds."""
    return datetime.fromtimestamp(epoch_s, tz=UTC)
