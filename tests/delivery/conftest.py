"""Executor tests run over both stores, on a manual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["memory", "rocksdb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> AsyncIterator[Store]:
    s = Store.in_memory(clock=clock) if request.param == "memory" else open_rocks_store(tmp_path / "db", clock=clock)
    yield s
    await s.close()
