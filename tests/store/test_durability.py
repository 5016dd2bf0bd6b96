"""What an ack means, per fsync policy, seen through a backend that holds syncs (``edgehub.testing.GatedBackend``)
over the in-memory and the RocksDB backend alike.

``always`` and ``interval``: no ack before the sync that covers the message has returned. ``none``: acks
without any sync (the documented risk). And the group write, not the producer, makes a message visible to
readers, so a producer cancelled while it waits does not hide its message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from edgehub.core import Message, RouteResult
from edgehub.store import Backend, FsyncPolicy, MemoryBackend, QueueId, Store
from edgehub.store.rocks import RocksBackend
from edgehub.testing import GatedBackend, ManualClock
from tests.store.conftest import keep_time

Q = QueueId("up", 0)
# How long an ack that does not wait for its sync would take to show up: microseconds. A generous bound on a
# wait for something that must not happen; no test waits it out for anything that must.
NO_ACK_WITHIN_S = 0.2


def msg(i: int) -> Message:
    return Message(body=f"m{i}".encode())


@pytest.fixture
def backends(store_kind: str, tmp_path: Path) -> tuple[Callable[[], Backend], Callable[[], Backend]]:
    """(open the backend, reopen it after close) for the kind under test."""
    memory = MemoryBackend()
    if store_kind == "memory":
        return (lambda: memory), memory.reopened
    return (lambda: RocksBackend(tmp_path / "db")), (lambda: RocksBackend(tmp_path / "db"))


@pytest.mark.parametrize("fsync", [FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL])
async def test_no_ack_comes_before_the_sync_that_covers_it(
    backends: tuple[Callable[[], Backend], Callable[[], Backend]], clock: ManualClock, fsync: FsyncPolicy
) -> None:
    open_backend, _ = backends
    backend = GatedBackend(open_backend())
    store = Store(backend, clock=clock, fsync=fsync, fsync_interval_ms=5)
    ticker = asyncio.create_task(keep_time(clock, 0.005))

    async def produce(i: int) -> None:
        await store.enqueue(msg(i), [RouteResult("up", 0)])
        backend.note("ack")

    try:
        async with asyncio.timeout(10):
            with backend.holding_syncs():
                tasks = [asyncio.create_task(produce(i)) for i in range(20)]
                await backend.wait_for_held(1)
                if fsync is FsyncPolicy.INTERVAL:
                    assert backend.unsynced_writes >= 1  # written, not yet synced
                done, _ = await asyncio.wait(tasks, timeout=NO_ACK_WITHIN_S)
                assert not done
                assert backend.events == []
            await asyncio.gather(*tasks)
        assert backend.events[0] == "sync"
        assert backend.events.count("ack") == 20
        assert backend.syncs_done >= 1
        assert [it.message.body for it in store.read(Q, 0, 100)] == [f"m{i}".encode() for i in range(20)]
    finally:
        ticker.cancel()
        await store.close()


async def test_interval_syncs_are_paced_by_the_stores_clock(
    backends: tuple[Callable[[], Backend], Callable[[], Backend]], clock: ManualClock
) -> None:
    """The first sync is not delayed; the next waits until ``fsync_interval_ms`` has passed on the store's clock
    (not the machine's), and its message is acknowledged only after it."""
    open_backend, _ = backends
    backend = GatedBackend(open_backend())
    store = Store(backend, clock=clock, fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=50)
    try:
        async with asyncio.timeout(10):
            await store.enqueue(msg(0), [RouteResult("up", 0)])
            assert backend.syncs_done == 1
            second = asyncio.create_task(store.enqueue(msg(1), [RouteResult("up", 0)]))
            await clock.wait_for_sleepers(1)
            clock.advance(0.049)
            assert clock.sleepers == 1  # not yet: 49 ms of the 50
            assert not second.done()
            assert backend.syncs_done == 1
            clock.advance(0.001)
            await second
        assert backend.syncs_done == 2
    finally:
        await store.close()


async def test_fsync_none_acknowledges_without_any_sync(
    backends: tuple[Callable[[], Backend], Callable[[], Backend]], clock: ManualClock
) -> None:
    open_backend, _ = backends
    backend = GatedBackend(open_backend())
    store = Store(backend, clock=clock, fsync=FsyncPolicy.NONE)
    try:
        with backend.holding_syncs():  # a sync would hang the writes below: none may happen
            async with asyncio.timeout(10):
                await asyncio.gather(*(store.enqueue(msg(i), [RouteResult("up", 0)]) for i in range(20)))
        assert backend.syncs_started == 0
        assert backend.unsynced_writes >= 1
    finally:
        await store.close()


async def test_producer_cancelled_while_its_write_is_in_flight_is_stored_and_visible_to_readers(
    backends: tuple[Callable[[], Backend], Callable[[], Backend]], clock: ManualClock
) -> None:
    open_backend, reopen = backends
    backend = GatedBackend(open_backend())
    store = Store(backend, clock=clock)
    try:
        async with asyncio.timeout(10):
            with backend.holding_syncs():
                producer = asyncio.create_task(store.enqueue(msg(1), [RouteResult("up", 0)]))
                await backend.wait_for_held(1)
                producer.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await producer
                assert store.end_offset(Q) == 0  # not durable yet: readers must not see it
    finally:
        await store.close()  # finishes the group's write
    # No later enqueue moved it: the group write did, when it succeeded.
    assert store.end_offset(Q) == 1
    reopened = Store(reopen(), clock=clock)
    try:
        assert [it.message.body for it in reopened.read(Q, 0, 10)] == [b"m1"]
    finally:
        await reopened.close()
