"""``bench.demo``'s figures: percentiles by nearest rank, per-priority sent/delivered/expired, the table, and the
PNG (matplotlib: the ``demo`` extra, which ``make test`` installs)."""

from __future__ import annotations

from pathlib import Path

from bench.demo import Samples
from bench.demo_report import PriorityFigures, percentile, plot, table


def test_percentiles_are_nearest_rank_and_none_without_values() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 51.0  # rank round(0.5 x 99) = 50 (0-based)
    assert percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([], 0.5) is None


def test_figures_take_delivered_from_the_lake_when_it_ran_and_expired_is_what_never_arrived() -> None:
    landed = [(100.0, 100.5), (100.0, 101.0), (100.0, 160.0)]
    f = PriorityFigures.of(priority=5, sent=10, lake_rows=3, landed=landed)
    assert (f.delivered, f.expired, f.delivered_from) == (3, 7, "lake")
    assert (f.latency_p50_s, f.latency_p99_s) == (1.0, 60.0)
    g = PriorityFigures.of(priority=0, sent=2, lake_rows=None, landed=landed[:2])
    assert (g.delivered, g.expired, g.delivered_from) == (2, 0, "landing")
    lines = table({0: g, 5: f}, expired_total=7)
    assert lines[1].split() == ["p0", "2", "2", "0", "0.50", "s", "1.00", "s"]
    assert lines[2].split()[:4] == ["p5", "10", "3", "7"]
    assert "the hub's own TTL count: 7" in lines[-1]


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    samples = Samples()
    for i in range(20):
        samples.t.append(i * 0.5)
        samples.depth[0].append(0)
        samples.depth[5].append(i if 4 <= i < 12 else 0)
        samples.up_bytes.append(i * 4000)
    png = tmp_path / "demo.png"
    plot(png, samples, outage_at=2.0, outage_s=4.0, rate_bps=64_000)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
