from __future__ import annotations

import asyncio

import pytest

from edgehub.core import Clock
from edgehub.testing import ManualClock


def test_manual_clock_is_a_clock() -> None:
    assert isinstance(ManualClock(), Clock)


async def test_advance_wakes_sleepers_in_deadline_order() -> None:
    clock = ManualClock(start=100.0)
    woke: list[str] = []
    first_woke = asyncio.Event()

    async def sleeper(name: str, delay: float) -> None:
        await clock.sleep(delay)
        woke.append(name)
        first_woke.set()

    async with asyncio.timeout(5), asyncio.TaskGroup() as tg:
        tg.create_task(sleeper("late", 10))
        tg.create_task(sleeper("early", 2))
        await clock.wait_for_sleepers(2)
        clock.advance(5)
        await first_woke.wait()
        assert woke == ["early"]
        assert clock.time() == 105.0
        clock.advance(5)
    assert woke == ["early", "late"]


def test_clock_never_goes_back() -> None:
    with pytest.raises(ValueError):
        ManualClock().advance(-1)
