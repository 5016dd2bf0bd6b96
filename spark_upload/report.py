"""What the lake holds, in a few lines: rows per table, per device, per priority, and why lines were quarantined.

Usage:
    python -m spark_upload.report --landing data/landing --lake data/lake --checkpoint data/checkpoint \\
        [--master local[2]] [--no-ingest]

Runs the ingestion job once (``--trigger available-now``: what has landed, then stop; ``spark_upload.job``) and
prints what the tables hold; ``--no-ingest`` only prints. ``make ingest`` is this over ``./data``. One Spark
session does both (starting one costs seconds).

Invariants: a table that does not exist yet counts 0 rows (a fresh lake, or no bad line ever: no quarantine
folder); the report reads the tables, never writes them; a refusal of the job (another checkpoint's lake, a
Spark laid out otherwise) is one ``ingest.refused`` line on stderr and exit status 2, as for the job itself.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from spark_upload.job import run
from spark_upload.settings import JobSettings, build_session
from spark_upload.sink import CheckpointMismatchError
from spark_upload.spark_internals import SparkInternalsError
from spark_upload.tables import TABLES

__all__ = ["LakeSummary", "format_summary", "lake_summary", "main"]

# A report is for a person: the 20 busiest devices and reasons are shown, the rest summed in one line.
TOP = 20


@dataclass(frozen=True, slots=True)
class LakeSummary:
    """Rows per table; bronze rows per device (``device`` or ``device/module``) and per priority; quarantined
    lines per reason. Counts only: nothing here grows with the data but the keys."""

    rows: dict[str, int]
    per_device: dict[str, int] = field(default_factory=dict)
    per_priority: dict[int, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)


def _table(spark: SparkSession, lake: str, name: str) -> DataFrame | None:
    try:
        return spark.read.parquet(f"{lake.rstrip('/')}/{name}")
    except AnalysisException:  # PATH_NOT_FOUND, or a folder with no data file yet: the table is empty
        return None


def lake_summary(spark: SparkSession, lake: str) -> LakeSummary:
    """Read the tables of ``lake`` and count."""
    frames = {name: _table(spark, lake, name) for name in TABLES}
    rows = {name: (frame.count() if frame is not None else 0) for name, frame in frames.items()}
    per_device: dict[str, int] = {}
    per_priority: dict[int, int] = {}
    quarantined: dict[str, int] = {}
    bronze = frames["bronze"]
    if bronze is not None:
        for r in bronze.groupBy("device_id", "module_id").count().collect():
            key = r["device_id"] if r["module_id"] is None else f"{r['device_id']}/{r['module_id']}"
            per_device[key] = per_device.get(key, 0) + int(r["count"])
        per_priority = {int(r["priority"]): int(r["count"]) for r in bronze.groupBy("priority").count().collect()}
    quarantine = frames["quarantine"]
    if quarantine is not None:
        quarantined = {str(r["reason"]): int(r["count"]) for r in quarantine.groupBy("reason").count().collect()}
    return LakeSummary(rows=rows, per_device=per_device, per_priority=per_priority, quarantined=quarantined)


def _ranked(counts: dict[str, int], indent: str) -> list[str]:
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = [f"{indent}{key:<32} {n:>10,}" for key, n in ranked[:TOP]]
    if len(ranked) > TOP:
        rest = ranked[TOP:]
        lines.append(f"{indent}{f'({len(rest)} more)':<32} {sum(n for _, n in rest):>10,}")
    return lines


def format_summary(summary: LakeSummary, lake: str) -> list[str]:
    """The summary as the lines ``make ingest`` prints."""
    lines = [f"lake {lake}:"]
    lines += [f"  {name:<14} {summary.rows.get(name, 0):>10,} rows" for name in TABLES]
    lines.append("bronze rows per device:")
    lines += _ranked(summary.per_device, "  ") or ["  (none)"]
    lines.append("bronze rows per priority:")
    lines += [f"  p{p:<31} {n:>10,}" for p, n in sorted(summary.per_priority.items())] or ["  (none)"]
    lines.append("quarantined lines per reason:")
    lines += _ranked(summary.quarantined, "  ") or ["  (none)"]
    return lines


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m spark_upload.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--landing", default="data/landing", help="landing zone folder or URL (default data/landing)")
    p.add_argument("--lake", default="data/lake", help="where the tables go (default data/lake)")
    p.add_argument("--checkpoint", default="data/checkpoint", help="the job's checkpoint (default data/checkpoint)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--no-ingest", action="store_true", help="only report what the lake holds")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parse(sys.argv[1:] if argv is None else argv)
    spark = build_session(master=ns.master, app_name="edgehub-report", shuffle_partitions=2)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if not ns.no_ingest and "://" not in ns.landing and not Path(ns.landing).is_dir():
            print(f"nothing has landed in {ns.landing} yet (the hub creates it on its first upload)")
        elif not ns.no_ingest:
            run(spark, JobSettings(landing=ns.landing, lake=ns.lake, checkpoint=ns.checkpoint, print_metrics=False))
        for line in format_summary(lake_summary(spark, ns.lake), ns.lake):
            print(line)
    except (CheckpointMismatchError, SparkInternalsError) as exc:
        print(f"ingest.refused error={type(exc).__name__} {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
