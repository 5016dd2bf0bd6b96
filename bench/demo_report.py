"""The figures ``bench.demo`` reports: per priority sent, delivered, expired and latency; the lake's rows per
priority (one run of the Spark job); and the PNG of queue depth and uplink use over time.

pyspark and matplotlib are imported inside the functions that need them, so the demo runs without either when
asked to (``--no-spark``, ``--no-plot``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.demo import Samples

__all__ = ["PriorityFigures", "lake_rows_per_priority", "percentile", "plot", "table"]


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``; None when empty."""
    v = sorted(values)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))] if v else None


@dataclass(frozen=True)
class PriorityFigures:
    priority: int
    sent: int  # acknowledged by the hub
    delivered: int  # rows in the lake (or landed, without the Spark job)
    expired: int  # sent, never delivered, nothing left queued: the edge's TTL took it
    latency_p50_s: float | None
    latency_p99_s: float | None
    delivered_from: str  # "lake" or "landing"

    @classmethod
    def of(
        cls, *, priority: int, sent: int, lake_rows: int | None, landed: list[tuple[float, float]]
    ) -> PriorityFigures:
        """From what the devices had acknowledged, the lake's rows and each landed message's (sent, landed) times."""
        latencies = [landed_at - sent_at for sent_at, landed_at in landed]
        delivered = lake_rows if lake_rows is not None else len(landed)
        return cls(
            priority=priority,
            sent=sent,
            delivered=delivered,
            expired=max(0, sent - delivered),
            latency_p50_s=percentile(latencies, 0.5),
            latency_p99_s=percentile(latencies, 0.99),
            delivered_from="lake" if lake_rows is not None else "landing",
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def table(figures: dict[int, PriorityFigures], *, expired_total: int) -> list[str]:
    """One row per priority, and the hub's own count of TTL removals beside the table's sum."""

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} s"

    lines = [f"{'priority':<10}{'sent':>8}{'delivered':>11}{'expired':>9}{'latency p50':>14}{'p99':>11}"]
    for p, f in sorted(figures.items()):
        lines.append(
            f"{'p' + str(p):<10}{f.sent:>8,}{f.delivered:>11,}{f.expired:>9,}"
            f"{secs(f.latency_p50_s):>14}{secs(f.latency_p99_s):>11}"
        )
    source = next(iter(figures.values())).delivered_from if figures else "lake"
    lines.append(
        f"delivered: rows in the {source}; expired: sent less delivered (the queues drained); the hub's own TTL "
        f"count: {expired_total:,} (it also counts a message whose ack the outage cut off and that it then let "
        "expire, though a copy may have got through); latency: device publish to landing"
    )
    return lines


def lake_rows_per_priority(landing: Path, out: Path) -> dict[int, int]:
    """Run the Spark job once (available-now) over ``landing`` into ``out/lake``; bronze rows per priority."""
    from spark_upload.job import run
    from spark_upload.report import format_summary, lake_summary
    from spark_upload.settings import JobSettings, build_session

    print("demo: the Spark job (available-now) over the landing zone", flush=True)
    spark = build_session(master="local[2]", app_name="edgehub-demo", shuffle_partitions=2)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        lake = str(out / "lake")
        run(
            spark, JobSettings(landing=str(landing), lake=lake, checkpoint=str(out / "checkpoint"), print_metrics=False)
        )
        summary = lake_summary(spark, lake)
    finally:
        spark.stop()
    for line in format_summary(summary, lake):
        print(line)
    return summary.per_priority


def plot(png: Path, samples: Samples, *, outage_at: float, outage_s: float, rate_bps: float) -> None:
    """Queue depth per priority (top) and uplink use (bottom) over time, the outage shaded on both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6), constrained_layout=True)
    for p, depths in sorted(samples.depth.items()):
        top.plot(samples.t, depths, label=f"p{p} ({'alerts' if p == 0 else 'telemetry'})", linewidth=1.5)
    top.set_ylabel("queued messages")
    top.set_title("edgehub demo: queue depth per priority and uplink use; the outage shaded")
    top.legend(loc="upper left")
    # Over 2 s windows: the devices publish once a second, and a shorter window shows that beat, not the use.
    use_t, use_kbps = [], []
    span = max(1, round(2.0 / max(samples.t[1] - samples.t[0], 1e-3))) if len(samples.t) > 1 else 1
    for i in range(span, len(samples.t)):
        dt = samples.t[i] - samples.t[i - span]
        if dt > 0:
            use_t.append(samples.t[i])
            use_kbps.append((samples.up_bytes[i] - samples.up_bytes[i - span]) * 8 / dt / 1000)
    bottom.plot(use_t, use_kbps, color="tab:green", linewidth=1.2, label="uplink use (all bytes up, 2 s windows)")
    bottom.axhline(rate_bps / 1000, color="gray", linestyle="--", linewidth=1, label=f"link {rate_bps / 1000:g} kbit/s")
    bottom.set_ylabel("kbit/s")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper left")
    for ax in (top, bottom):
        ax.axvspan(outage_at, outage_at + outage_s, color="tab:red", alpha=0.12, label="_outage")
        ax.grid(True, alpha=0.3)
    top.text(outage_at + outage_s / 2, top.get_ylim()[1] * 0.92, "link down", ha="center", color="tab:red")
    fig.savefig(png, dpi=110)
    plt.close(fig)
