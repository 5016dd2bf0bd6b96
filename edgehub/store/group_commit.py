"""Group commit: many concurrent producers, one durable write per group.

Producers call ``submit(item)``; a single writer task takes everything waiting (up to ``max_group`` items),
hands it to ``write(group)`` in a worker thread (so the event loop keeps accepting while the disk syncs), and
then releases every producer of that group, in arrival order. If ``write`` raises, every producer of that
group gets the error and nothing else is affected: the next group is written as usual.

Invariants: a producer returns only after the write covering its item returned; items are written in arrival
order; at most one write is in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from edgehub.core import StoreClosedError

__all__ = ["GroupCommitter"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class GroupCommitter(Generic[T]):
    """Batches ``submit`` calls into ``write`` calls. ``write`` is async (it awaits its own thread)."""

    def __init__(self, write: Callable[[list[T]], Awaitable[None]], *, max_group: int = 1024) -> None:
        if max_group < 1:
            raise ValueError("max_group must be at least 1")
        self._write = write
        self._max_group = max_group
        self._pending: deque[tuple[T, asyncio.Future[None]]] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.groups_written = 0

    async def submit(self, item: T) -> None:
        """Return once ``item`` is durable; raise what its group's write raised."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(), name="store.group_commit")
        fut: asyncio.Future[None] = loop.create_future()
        self._pending.append((item, fut))
        assert self._wake is not None
        self._wake.set()
        await asyncio.shield(fut)  # a cancelled producer must not cancel the group's write

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            if not self._pending:
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            n = min(len(self._pending), self._max_group)
            group = [self._pending.popleft() for _ in range(n)]
            try:
                await self._write([item for item, _ in group])
            except asyncio.CancelledError:
                for _, fut in group:
                    if not fut.done():
                        fut.set_exception(StoreClosedError("the store closed before this write completed"))
                raise
            except Exception as exc:
                log.warning("store.group_failed size=%d error=%s", n, exc)
                for _, fut in group:
                    if not fut.done():
                        fut.set_exception(exc)
                        fut.exception()  # mark retrieved: a producer that went away must not warn
            else:
                self.groups_written += 1
                for _, fut in group:
                    if not fut.done():
                        fut.set_result(None)

    async def close(self) -> None:
        """Write what is pending, then stop. Later ``submit`` calls raise ``StoreClosedError``."""
        self._closed = True
        if self._task is not None:
            assert self._wake is not None
            self._wake.set()
            await self._task
