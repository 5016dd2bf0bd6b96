"""A lane over two upload links (real landing zones in tmp_path, a RocksDB store, the endpoint executor): a write
the preferred zone refuses fails over to the other at once, and the preferred one is used again once it writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.core import Message, RouteResult
from edgehub.delivery import EndpointExecutor, ExecutorSettings, RetryPolicy
from edgehub.store import QueueId, Store
from edgehub.store.rocks import open_rocks_store
from edgehub.upstream.budget import BudgetLedger
from edgehub.upstream.landing import LandingZone
from edgehub.upstream.links import PROBE_AFTER_S, LinkedUpstream, LinkSpec
from edgehub.upstream.segment import decode_segment
from edgehub.upstream.upload_transport import UploadTransport

pytestmark = pytest.mark.timeout(60)

QUICK = ExecutorSettings(retry_policy=RetryPolicy(minimum_delay_s=0.1, maximum_delay_s=0.2), cleanup_interval_s=3600)
P0 = QueueId("$upstream", 0)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_rocks_store(tmp_path / "db")
    yield s
    await s.close()


def bodies(zone: Path) -> list[bytes]:
    out = []
    for f in sorted(zone.rglob("*.jsonl.gz")):
        if not f.name.startswith("."):
            out += [r.body for r in decode_segment(f.read_bytes())]
    return out


async def test_a_refused_write_fails_over_to_the_other_zone_and_the_preferred_one_is_used_again(
    store: Store, tmp_path: Path
) -> None:
    cheap, dear = tmp_path / "cheap", tmp_path / "dear"
    cheap.write_text("a file where the zone's folder should be: every write fails")
    links = [
        (LinkSpec(name="disk", settle_s=0), UploadTransport(LandingZone(str(cheap)), hub_id="gw")),
        (LinkSpec(name="remote", cost_per_mib=1.0), UploadTransport(LandingZone(str(dear)), hub_id="gw")),
    ]
    up = LinkedUpstream(links, BudgetLedger(None, {"disk": ((), 0.0), "remote": ((), 1.0)}))
    async with asyncio.timeout(30), up, EndpointExecutor(store, up, settings=QUICK) as ex:
        await store.enqueue(Message(body=b"first"), [RouteResult("$upstream", 0, None)])
        ex.notify()
        await ex.wait_for(lambda: store.checkpoint(P0).committed == 0)
        assert bodies(dear) == [b"first"]
        assert {s.name: s.state.value for s in up.links_status()}["disk"] == "down"
        cheap.unlink()  # the zone writes again; tried after PROBE_AFTER_S
        await up.wait_for(lambda: up.choose(0) is not None and up.choose(0).spec.name == "disk")  # type: ignore[union-attr]
        await store.enqueue(Message(body=b"second"), [RouteResult("$upstream", 0, None)])
        ex.notify()
        await ex.wait_for(lambda: store.checkpoint(P0).committed == 1)
        assert bodies(cheap) == [b"second"]
        remote = {s.name: s for s in up.links_status()}["remote"]
        assert remote.bytes_this_period > 0
        assert remote.batches == 1
    assert PROBE_AFTER_S <= 5  # the wait above is bounded by it
