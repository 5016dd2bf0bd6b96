"""ChurnCollector: a collection once enough connections closed, at most one per interval, none while idle."""

from __future__ import annotations

import gc
import platform
import weakref

from edgehub.hub import ConnectionLimiter, Ticket
from edgehub.runtime.memory import ChurnCollector, _malloc_trim, give_memory_back
from edgehub.testing import ManualClock


def _close(limiter: ConnectionLimiter, n: int) -> None:
    for _ in range(n):
        ticket = limiter.admit("10.0.0.1")
        assert isinstance(ticket, Ticket)
        ticket.release()
        ticket.release()  # released once, counted once


def test_it_collects_after_enough_closes_and_not_more_often_than_its_interval() -> None:
    limiter = ConnectionLimiter(max_connections=100, max_pending=50, max_pending_per_address=50)
    clock = ManualClock()
    collector = ChurnCollector(limiter, min_closed=32, min_interval_s=5.0, clock=clock)
    assert not collector.due()  # idle: nothing to do
    _close(limiter, 31)
    assert limiter.closed == 31
    assert not collector.due()
    _close(limiter, 1)
    assert collector.due()
    collector.collect()
    assert collector.collections == 1
    _close(limiter, 100)
    assert not collector.due()  # within the interval
    clock.advance(5.0)
    assert collector.due()


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_giving_memory_back_frees_cycles_the_young_collections_left() -> None:
    gc.disable()
    try:
        node = _Node()
        ref = weakref.ref(node)
        del node
        assert ref() is not None  # a cycle: reference counting alone leaves it
        assert give_memory_back() >= 1
        assert ref() is None
    finally:
        gc.enable()


def test_the_c_library_trim_is_found_where_the_c_library_is_glibc() -> None:
    # looked up in the process itself (no find_library, no ldconfig subprocess): on glibc it must be there, or the
    # hub would silently keep freed heap memory mapped after churn
    if platform.libc_ver()[0] != "glibc":
        assert _malloc_trim() is None or callable(_malloc_trim())
        return
    trim = _malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)  # malloc_trim's answer: 1 when memory was released
