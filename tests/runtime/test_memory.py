"""ChurnCollector: a collection once enough connections closed, on any head, or once one closed while the process
grew by ``min_growth_bytes`` since the last collection; at most one per interval, none while idle; and the running
hub's collector counts the AMQP head's closes as well as the MQTT head's."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import platform
import weakref
from pathlib import Path

import pytest

from edgehub.hub import ConnectionLimiter, Ticket
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.memory import ChurnCollector, _malloc_trim, give_memory_back, rss_bytes
from edgehub.testing import ManualClock
from tests.e2e.serving import serving


def _close(limiter: ConnectionLimiter, n: int) -> None:
    for _ in range(n):
        ticket = limiter.admit("10.0.0.1")
        assert isinstance(ticket, Ticket)
        ticket.release()
        ticket.release()  # released once, counted once


class _Rss:
    """A process's RSS as the test sets it (the collector reads it through ``rss``)."""

    def __init__(self, mib: int) -> None:
        self.bytes = mib << 20

    def __call__(self) -> int:
        return self.bytes


def test_it_collects_after_enough_closes_and_not_more_often_than_its_interval() -> None:
    limiter = ConnectionLimiter(max_connections=100, max_pending=50, max_pending_per_address=50)
    clock = ManualClock()
    collector = ChurnCollector(limiter, min_closed=32, min_interval_s=5.0, clock=clock, rss=_Rss(60))
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


def test_one_close_after_the_process_grew_by_min_growth_collects_and_one_close_without_growth_does_not() -> None:
    limiter = ConnectionLimiter(max_connections=100, max_pending=50, max_pending_per_address=50)
    clock, rss = ManualClock(), _Rss(60)
    collector = ChurnCollector(
        limiter, min_closed=32, min_growth_bytes=16 << 20, min_interval_s=5.0, clock=clock, rss=rss
    )
    rss.bytes = 160 << 20  # one client pushed a lot
    assert not collector.due()  # grown, but nothing closed: what grew may be alive
    _close(limiter, 1)
    assert collector.due()  # that one close: give it back now, not after 31 more
    collector.collect()
    rss.bytes = 90 << 20  # what the collection gave back
    collector.collect()  # measured after the collection: the new base
    clock.advance(5.0)
    _close(limiter, 1)
    assert not collector.due()  # a close with no growth since: nothing to give back
    rss.bytes = 105 << 20
    assert not collector.due()  # 15 MiB: under min_growth
    rss.bytes = 106 << 20
    assert collector.due()
    collector.collect()
    rss.bytes = 200 << 20
    _close(limiter, 1)
    assert not collector.due()  # within the interval, however much it grew


def test_without_procfs_only_the_count_of_closes_decides() -> None:
    limiter = ConnectionLimiter(max_connections=100, max_pending=50, max_pending_per_address=50)
    collector = ChurnCollector(limiter, min_closed=2, clock=ManualClock(), rss=lambda: None)
    _close(limiter, 1)
    assert not collector.due()
    _close(limiter, 1)
    assert collector.due()


def test_rss_bytes_reads_this_process() -> None:
    rss = rss_bytes()
    if platform.system() != "Linux":
        assert rss is None or rss > 0
        return
    assert rss is not None
    assert 10 << 20 < rss < 16 << 30  # a Python process with the hub imported: tens of MiB, never gigabytes


def test_closes_on_every_head_count_towards_a_collection() -> None:
    mqtt = ConnectionLimiter(max_connections=100, max_pending=50, max_pending_per_address=50)
    amqp = ConnectionLimiter(max_connections=100, max_pending=50, max_pending_per_address=50)
    collector = ChurnCollector(mqtt, amqp, min_closed=32, min_interval_s=5.0, clock=ManualClock(), rss=_Rss(60))
    _close(mqtt, 16)
    _close(amqp, 15)
    assert collector.closed == 31
    assert not collector.due()
    _close(amqp, 1)
    assert collector.due()


class _Collected(logging.Handler):
    """Sets ``event`` when the collector logs a collection (on the event loop's thread, as the collector runs)."""

    def __init__(self, event: asyncio.Event) -> None:
        super().__init__(logging.DEBUG)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("runtime.memory_collected"):
            self.event.set()


async def _closed_by_the_hub(port: int) -> None:
    """An AMQP connection that sends what is not AMQP: the hub answers with its SASL header and closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        await reader.read()  # to EOF
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.timeout(60)
async def test_the_running_hub_gives_memory_back_after_amqp_connections_close(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}))
    config = HubConfig(manifest=manifest, data_dir=tmp_path / "data", mqtt_port=0, mqtts_port=None, amqp_port=0)
    collected = asyncio.Event()
    handler = _Collected(collected)
    logger = logging.getLogger("edgehub.runtime.memory")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        async with serving(config) as ready:
            for _ in range(32):  # the collector's min_closed, all of them AMQP's (no MQTT connection at all)
                async with asyncio.timeout(10):
                    await _closed_by_the_hub(ready["amqp"])
            async with asyncio.timeout(10):  # the collector looks once a second
                await collected.wait()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


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
