"""GroupCommitter on its own: groups form while a write is in flight, acks follow arrival order, and a failed
write fails its group only."""

from __future__ import annotations

import asyncio

import pytest

from edgehub.core import StorageIOError, StoreClosedError
from edgehub.store import GroupCommitter


class Disk:
    """A write target a test steers: holds each write until released, fails the writes it is told to."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.fail: set[int] = set()  # indexes of writes to fail
        self.gate = asyncio.Event()
        self.writing = asyncio.Event()

    async def write(self, group: list[int]) -> None:
        self.writing.set()
        await self.gate.wait()
        self.groups.append(group)
        if len(self.groups) - 1 in self.fail:
            raise StorageIOError("No space left on device")


class Submitted:
    """Counts producers that have handed their item to ``submit``; ``wait_for(n)`` returns once ``n`` have.

    A producer calls ``entered()`` right before ``await gc.submit(item)``: ``submit`` queues the item before it
    first suspends, so by the time a waiter wakes up, every producer counted has its item queued."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Event()

    def entered(self) -> None:
        self.count += 1
        self._changed.set()

    async def wait_for(self, n: int) -> None:
        while self.count < n:
            self._changed.clear()
            await self._changed.wait()


async def test_items_arriving_during_a_write_form_the_next_group_acked_in_order() -> None:
    disk = Disk()
    gc: GroupCommitter[int] = GroupCommitter(disk.write)
    acks: list[int] = []
    submitted = Submitted()

    async def submit(i: int) -> None:
        submitted.entered()
        await gc.submit(i)
        acks.append(i)

    async with asyncio.timeout(5), asyncio.TaskGroup() as tg:
        tg.create_task(submit(0))
        await disk.writing.wait()  # write of [0] in flight
        for i in range(1, 6):
            tg.create_task(submit(i))
        await submitted.wait_for(6)  # all five queued behind the write in flight
        disk.gate.set()
    assert disk.groups == [[0], [1, 2, 3, 4, 5]]
    assert acks == [0, 1, 2, 3, 4, 5]
    await gc.close()


async def test_failed_write_fails_its_group_only() -> None:
    disk = Disk()
    disk.fail = {1}
    gc: GroupCommitter[int] = GroupCommitter(disk.write)
    submitted = Submitted()

    async def submit(i: int) -> None:
        submitted.entered()
        await gc.submit(i)

    async with asyncio.timeout(5):
        first = asyncio.create_task(submit(0))
        await disk.writing.wait()
        doomed = [asyncio.create_task(submit(i)) for i in (1, 2)]
        await submitted.wait_for(3)
        disk.gate.set()
        await first
        results = await asyncio.gather(*doomed, return_exceptions=True)
        assert all(isinstance(r, StorageIOError) for r in results)
        await submit(3)
    assert disk.groups == [[0], [1, 2], [3]]
    await gc.close()
    with pytest.raises(StoreClosedError):
        await gc.submit(4)


async def test_a_cancelled_producer_leaves_its_item_in_the_group_and_the_others_are_acked() -> None:
    disk = Disk()
    gc: GroupCommitter[int] = GroupCommitter(disk.write)
    submitted = Submitted()

    async def submit(i: int) -> int:
        submitted.entered()
        await gc.submit(i)
        return i

    async with asyncio.timeout(5):
        first = asyncio.create_task(submit(0))
        await disk.writing.wait()
        cancelled, kept = asyncio.create_task(submit(1)), asyncio.create_task(submit(2))
        await submitted.wait_for(3)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        disk.gate.set()
        assert list(await asyncio.gather(first, kept)) == [0, 2]
    assert disk.groups == [[0], [1, 2]]  # the cancelled producer's item was written all the same
    await gc.close()


async def test_groups_are_capped_at_max_group() -> None:
    disk = Disk()
    disk.gate.set()
    gc: GroupCommitter[int] = GroupCommitter(disk.write, max_group=2)
    async with asyncio.timeout(5):
        await asyncio.gather(*(gc.submit(i) for i in range(5)))
    assert [len(g) for g in disk.groups] == [2, 2, 1]
    await gc.close()
