"""Giving memory back once connections are gone.

``edgehub run`` runs Python's cycle collector rarely (``tune_gc``: a young collection every 50,000 allocations,
the start-up objects frozen out): that is what keeps per-message CPU low. Our own connection objects are freed
by reference counting when they close, but the event loop's TLS objects (uvloop's and asyncio's SSL protocols)
hold cycles of their own, and after a burst of connections that came and went (a flood of handshakes, a fleet
reconnecting) an idle hub allocates too little to reach the next collection: their memory, buffers included,
stays. And glibc keeps freed heap memory mapped unless told to give it back.

``ChurnCollector`` watches how many connections have closed, over every head it is given (each head's
``ConnectionLimiter.closed``: MQTT's and AMQP's; a flood of AMQP connections leaves proton's buffers and the same
TLS cycles behind) and, once ``min_interval_s`` has passed since its last collection, runs a full collection and
then ``malloc_trim(0)`` where the C library has it, so that RSS follows what is alive again, when either

* at least ``min_closed`` connections have closed since its last collection (a flood, a fleet reconnecting), or
* at least one has, and the process's RSS is ``min_growth_bytes`` over what it was after the last collection:
  one client that pushed hundreds of megabytes (a subscription it never read, a long burst) leaves as much
  freed heap behind as a thousand small ones, and must not wait for 31 others to close before it is given back.

Invariants: at most one collection per ``min_interval_s`` (a collection costs milliseconds; under steady churn
it is a small, bounded share of the CPU), none while no connection closes (an idle hub does nothing, and the
RSS is read only after a close), and the collector never raises out of its task.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import time
from collections.abc import Callable

from edgehub.core import Clock, SystemClock
from edgehub.hub import ConnectionLimiter

__all__ = ["ChurnCollector", "give_memory_back", "rss_bytes"]

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[], object] | None:
    """The C library's ``malloc_trim(0)``, looked up at the first collection: ctypes is not loaded (~0.2 MB) by a hub
    that never collects, and the symbol is taken from the process itself (glibc is already in it), not found with
    ``ctypes.util.find_library``, which runs ``ldconfig -p`` in a subprocess."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim with
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


@functools.cache
def _page_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int | None:
    """This process's resident set, from ``/proc/self/statm`` (one read of procfs, no disk); None where there
    is no procfs."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _page_bytes()
    except (OSError, ValueError, IndexError):
        return None


def give_memory_back() -> int:
    """A full cycle collection, then the C library's trim of freed heap memory. Returns the objects collected."""
    found = gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim()
    return found


class ChurnCollector:
    """``await collector.run()`` in a task: collects after connections closed on any of ``limiters`` (one per
    serving head; see the module docstring)."""

    def __init__(
        self,
        *limiters: ConnectionLimiter,
        min_closed: int = 32,
        min_growth_bytes: int = 16 * 2**20,
        min_interval_s: float = 5.0,
        poll_s: float = 1.0,
        clock: Clock | None = None,
        rss: Callable[[], int | None] = rss_bytes,
    ) -> None:
        if not limiters:
            raise ValueError("a collector watches at least one head's connections")
        if min_closed < 1 or min_growth_bytes < 1 or min_interval_s < 0 or poll_s <= 0:
            raise ValueError("min_closed and min_growth_bytes must be at least 1, the intervals positive")
        self._limiters = limiters
        self._min_closed = min_closed
        self._min_interval_s = min_interval_s
        self._min_growth_bytes = min_growth_bytes
        self._poll_s = poll_s
        self._clock = clock or SystemClock()
        self._rss = rss
        self._seen = self.closed
        self._last = float("-inf")
        self._rss_after = rss()  # what the process held after the last collection (at start: before any)
        self.collections = 0

    @property
    def closed(self) -> int:
        """Connections closed since start, over every head watched."""
        return sum(limiter.closed for limiter in self._limiters)

    def due(self) -> bool:
        closed = self.closed - self._seen
        if closed < 1 or self._clock.monotonic() - self._last < self._min_interval_s:
            return False
        if closed >= self._min_closed:
            return True
        now, before = self._rss(), self._rss_after
        return now is not None and before is not None and now - before >= self._min_growth_bytes

    def collect(self) -> None:
        self._seen = self.closed
        self._last = self._clock.monotonic()
        started = time.perf_counter()
        found = give_memory_back()
        self._rss_after = self._rss()
        self.collections += 1
        log.debug("runtime.memory_collected objects=%d seconds=%.4f", found, time.perf_counter() - started)

    async def run(self) -> None:
        while True:
            await self._clock.sleep(self._poll_s)
            if self.due():
                try:
                    self.collect()
                except Exception:  # never take the hub down for housekeeping
                    log.exception("runtime.memory_collect_failed")
