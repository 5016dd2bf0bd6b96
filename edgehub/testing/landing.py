"""A real landing zone that tests steer: it refuses writes, or holds them until released, on command.

``SteerableLandingZone`` is ``edgehub.upstream.landing.LandingZone`` on a real folder (every write that goes
through lands as a real file, with the zone's guarantees), with three switches in front of it:

* ``refuse(kind)``: every write raises ``TransportError(kind)`` at once, as a landing zone that refuses
  connections or permissions does, until ``accept()``;
* ``hold()``: every write blocks (in the caller's worker thread) until ``release()``, as a landing zone that
  stopped answering does; ``release()`` lets the held ones through;
* ``attempts`` counts every write called, refused and held ones included, and ``attempted_at`` keeps when each
  came (monotonic seconds), so a test can tell back-pressure from a busy loop.

Thread-safe: writes come from worker threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from edgehub.core import FailureKind, TransportError
from edgehub.upstream.landing import LandingZone, WriteOutcome

__all__ = ["SteerableLandingZone"]


class SteerableLandingZone(LandingZone):
    """A ``LandingZone`` at ``url`` whose writes can be refused or held (see the module docstring)."""

    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(url, storage_options=storage_options)
        self._lock = threading.Lock()
        self._refuse: FailureKind | None = None
        self._open = threading.Event()
        self._open.set()
        self.attempts = 0
        self.attempted_at: list[float] = []
        self.held = 0  # writes blocked in hold() right now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None

    def refuse(self, kind: FailureKind = FailureKind.TRANSIENT) -> None:
        with self._lock:
            self._refuse = kind

    def accept(self) -> None:
        with self._lock:
            self._refuse = None

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def wait_attempts(self, n: int) -> None:
        """Return once ``attempts`` reaches ``n``. Bound it with ``asyncio.timeout``."""
        self._loop = asyncio.get_running_loop()
        while self.attempts < n:
            self._changed = asyncio.Event()
            await self._changed.wait()

    async def wait_held(self, n: int) -> None:
        """Return once ``n`` writes are blocked by ``hold()``. Bound it with ``asyncio.timeout``."""
        self._loop = asyncio.get_running_loop()
        while self.held < n:
            self._changed = asyncio.Event()
            await self._changed.wait()

    def _notify(self) -> None:
        loop, changed = self._loop, self._changed
        if loop is not None and changed is not None:
            loop.call_soon_threadsafe(changed.set)

    def write_path(self, relative_path: str, data: bytes) -> WriteOutcome:
        with self._lock:
            self.attempts += 1
            self.attempted_at.append(time.monotonic())
            refuse = self._refuse
        self._notify()
        if refuse is not None:
            raise TransportError(f"steerable landing zone refuses {relative_path}", kind=refuse)
        if not self._open.is_set():
            with self._lock:
                self.held += 1
            self._notify()
            self._open.wait()
            with self._lock:
                self.held -= 1
        return super().write_path(relative_path, data)
