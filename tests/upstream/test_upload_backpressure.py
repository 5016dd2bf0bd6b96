"""The upload transport against a real landing zone that refuses or hangs on command: maxUplinkBps caps the bytes
written, and a slow or refusing zone holds the executor back instead of being tried by every queue at once."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.core import FailureKind, Message, RouteResult
from edgehub.delivery import EndpointExecutor, ExecutorSettings
from edgehub.delivery.endpoint import QueuedMessage, ReportsUnreachable
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing.clock import ManualClock
from edgehub.testing.landing import SteerableLandingZone
from edgehub.upstream.upload_transport import UploadTransport

pytestmark = pytest.mark.timeout(60)


def _batch(first: int, n: int, *, body_bytes: int = 20) -> list[QueuedMessage]:
    return [
        QueuedMessage(
            message=Message(body=os.urandom(body_bytes), system_properties={"edgeMessageId": f"e-{i}"}),
            offset=i,
            priority=3,
            enqueued_at_s=1.7e9 + i,
            ttl_s=600,
        )
        for i in range(first, first + n)
    ]


def _segments(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.jsonl.gz") if not p.name.startswith("."))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_rocks_store(tmp_path / "db")
    yield s
    await s.close()


async def test_max_uplink_bps_holds_a_write_until_the_bucket_has_its_bytes(tmp_path: Path) -> None:
    clock = ManualClock()
    zone = SteerableLandingZone(str(tmp_path / "landing"))
    up = UploadTransport(zone, hub_id="hub1", max_uplink_bps=8_000, clock=clock)  # 1,000 bytes a second
    async with asyncio.timeout(30):
        big = await up.send(_batch(0, 1, body_bytes=100_000))  # above the 64 KiB burst: goes, leaves a debt
        assert big.succeeded
        debt_s = (int(big.details["wire_bytes"]) - 65_536) / 1_000
        small = asyncio.create_task(up.send(_batch(1, 1)))
        await clock.wait_for_sleepers(1)
        clock.advance(debt_s - 1.0)
        await clock.wait_for_sleepers(1)
        assert zone.attempts == 1  # the debt is not paid yet: nothing written
        clock.advance(2.0)
        assert (await small).succeeded
        assert zone.attempts == 2
        assert len(_segments(tmp_path / "landing")) == 2


async def test_a_refusing_landing_zone_parks_the_queues_and_is_probed_one_write_at_a_time(
    store: Store, tmp_path: Path
) -> None:
    clock = ManualClock()
    zone = SteerableLandingZone(str(tmp_path / "landing"))
    zone.refuse(FailureKind.TRANSIENT)
    up = UploadTransport(zone, hub_id="hub1")
    assert isinstance(up, ReportsUnreachable)
    async with (
        asyncio.timeout(30),
        EndpointExecutor(store, up, clock=clock, settings=ExecutorSettings(cleanup_interval_s=3600)) as ex,
    ):
        for priority in (0, 3, 5, 7):
            for i in range(3):
                await store.enqueue(Message(body=b"m%d" % i), [RouteResult("$upstream", priority, None)])
        ex.notify()
        await ex.wait_idle()
        assert zone.attempts == 1  # before: one write per priority, each retrying on its own schedule
        assert not ex.reachable
        zone.accept()
        await clock.wait_for_sleepers(2)  # the cleanup's and the pump's (its probe time)
        deadline = clock.next_deadline()
        assert deadline is not None
        clock.advance(deadline - clock.time())
        await ex.wait_for(lambda: len(_segments(tmp_path / "landing")) == 4)
        assert ex.reachable
        assert zone.attempts == 5


async def test_a_hung_landing_zone_fails_the_batch_in_time_and_no_second_write_starts_until_it_returns(
    tmp_path: Path,
) -> None:
    zone = SteerableLandingZone(str(tmp_path / "landing"))
    up = UploadTransport(zone, hub_id="hub1", write_timeout_s=0.3)
    zone.hold()
    async with asyncio.timeout(30):
        first = await up.send(_batch(0, 2))
        assert first.failure_kind is FailureKind.TIMEOUT
        assert len(first.failed) == 2
        second = await up.send(_batch(2, 2))
        assert second.failure_kind is FailureKind.TIMEOUT
        assert zone.attempts == 1  # the hung write is still the only one
        zone.release()
        third = await up.send(_batch(2, 2))
        assert [m.offset for m in third.succeeded] == [2, 3]
        assert zone.attempts == 2
        await up.close()
        assert len(_segments(tmp_path / "landing")) == 2  # the hung write landed when it returned
