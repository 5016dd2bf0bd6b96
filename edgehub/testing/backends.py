"""A store backend that shows what reached the disk, and can hold syncs: for tests of what an ack means.

``GatedBackend`` is a complete ``edgehub.store.Backend`` over another one (a ``MemoryBackend`` unless given).
Every synced write (``write(..., sync=True)``) and every ``sync_wal()`` is a *sync*. Inside
``with backend.holding_syncs():`` a sync waits, in the thread that called it (the store's writer thread),
until the block ends; ``await backend.wait_for_held(n)`` returns once ``n`` syncs are waiting.
``events`` lists, in the order they happened, ``"sync"`` each time a sync returned and whatever a test adds
with ``note()`` (an ``"ack"`` after ``enqueue`` returned, say), so a test can see which came first.

Unsynced writes go through at once. The counters and ``events`` may be read from any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from edgehub.store import Backend, MemoryBackend
from edgehub.store.backend import Op

__all__ = ["GatedBackend"]


class GatedBackend:
    """See the module docstring."""

    def __init__(self, inner: Backend | None = None) -> None:
        self.inner: Backend = inner if inner is not None else MemoryBackend()
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.syncs_started = 0
        self.syncs_done = 0
        self.held = 0  # syncs waiting for the gate now
        self.unsynced_writes = 0
        self.events: list[str] = []

    # -- steering -------------------------------------------------------------------------------------------
    @contextmanager
    def holding_syncs(self) -> Iterator[None]:
        """Syncs started inside the block wait until it ends (also when it ends with an error)."""
        self._open.clear()
        try:
            yield
        finally:
            self._open.set()

    async def wait_for_held(self, count: int = 1) -> None:
        """Return once ``count`` syncs are waiting at the gate. Bound it with ``asyncio.timeout``."""
        loop = asyncio.get_running_loop()
        while True:
            changed = asyncio.Event()
            with self._lock:
                if self.held >= count:
                    return
                entry = (loop, changed)
                self._watchers.append(entry)
            try:
                await changed.wait()
            finally:
                with self._lock:
                    self._watchers.remove(entry)

    def note(self, event: str) -> None:
        """Add a test's own entry to ``events``."""
        with self._lock:
            self.events.append(event)

    def _sync(self, do: Callable[[], None]) -> None:
        with self._lock:
            self.syncs_started += 1
            gated = not self._open.is_set()
            if gated:
                self.held += 1
            watchers = list(self._watchers)
        for loop, changed in watchers:
            loop.call_soon_threadsafe(changed.set)
        if gated:
            self._open.wait()
            with self._lock:
                self.held -= 1
        do()
        with self._lock:
            self.syncs_done += 1
            self.events.append("sync")

    # -- Backend ----------------------------------------------------------------------------------------------
    def families(self) -> list[str]:
        return self.inner.families()

    def ensure_family(self, name: str) -> None:
        self.inner.ensure_family(name)

    def get(self, family: str, key: bytes) -> bytes | None:
        return self.inner.get(family, key)

    def multi_get(self, family: str, keys: Sequence[bytes]) -> list[bytes | None]:
        return self.inner.multi_get(family, keys)

    def scan(self, family: str, from_key: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        return self.inner.scan(family, from_key, limit)

    def last_key(self, family: str) -> bytes | None:
        return self.inner.last_key(family)

    def write(self, ops: Sequence[Op], *, sync: bool) -> None:
        if sync:
            self._sync(lambda: self.inner.write(ops, sync=True))
            return
        self.inner.write(ops, sync=False)
        with self._lock:
            self.unsynced_writes += 1

    def sync_wal(self) -> None:
        self._sync(self.inner.sync_wal)

    def drop_overwritten(self, family: str) -> None:
        self.inner.drop_overwritten(family)

    def close(self) -> None:
        self.inner.close()
