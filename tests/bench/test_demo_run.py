"""``make demo`` in small (``bench.demo.run``): two devices, a 4 s outage, without the Spark job; every message
the hub acknowledged lands (the TTL outlives the outage), alerts before telemetry, and the PNG is drawn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.demo import Scenario, run

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(120)]


async def test_a_short_demo_delivers_what_the_hub_took_through_an_outage(tmp_path: Path) -> None:
    scenario = Scenario(devices=2, warm_s=3, outage_s=4, after_s=3)
    summary = await run(scenario, tmp_path / "out", spark=False, plot_png=True)
    p0, p5 = summary["p0"], summary["p5"]
    assert p5["sent"] >= 2 * 9  # two devices, a message a second for 10 s, less the ticks that were alerts
    for figures in (p0, p5):
        assert figures["delivered"] == figures["sent"]  # a 45 s TTL outlives a 4 s outage: nothing expires
        assert figures["expired"] == 0
        assert figures["delivered_from"] == "landing"
    assert summary["expired_ttl_hub"] == 0
    assert p5["latency_p99_s"] >= 3.0  # telemetry published into the outage waited for the link
    assert (await asyncio.to_thread(Path(summary["png"]).read_bytes))[:4] == b"\x89PNG"
