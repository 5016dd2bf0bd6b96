"""The store contract suite runs over both stores: ``store_factory`` opens (and reopens) one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from edgehub.store import MemoryBackend, Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing import ManualClock

StoreFactory = Callable[..., Store]


@pytest.fixture(params=["memory", "rocksdb"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store_factory(store_kind: str, tmp_path: Path, clock: ManualClock) -> StoreFactory:
    """Opens the store; calling it again after ``close`` reopens the same data (memory: the same backend)."""
    memory = MemoryBackend()

    def open_store(**settings: object) -> Store:
        if store_kind == "memory":
            return Store(memory.reopened(), clock=clock, **settings)  # type: ignore[arg-type]
        return open_rocks_store(tmp_path / "db", clock=clock, **settings)

    return open_store


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[Store]:
    s = store_factory()
    yield s
    await s.close()


async def keep_time(clock: ManualClock, step_s: float) -> None:
    """Advance ``clock`` whenever something sleeps on it: the interval fsync policy paces its syncs by the
    store's clock, and a test that is not about that pacing runs this beside it (cancel it at the end)."""
    while True:
        await clock.wait_for_sleepers()
        clock.advance(step_s)
