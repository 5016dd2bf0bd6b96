"""``spark_upload.report`` (``make ingest``): after one available-now run of the job, it counts what the tables
hold per table, device, priority and quarantine reason; a lake with nothing in it counts zeros."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from edgehub import Message
from edgehub.upstream.landing import LandingZone
from edgehub.upstream.segment import SegmentName, encode_segment, record_from_message
from spark_upload.job import run
from spark_upload.report import LakeSummary, format_summary, lake_summary
from tests.spark_upload.checkpoints import job_settings

pytestmark = pytest.mark.spark


def _land(zone: LandingZone, device: str, module: str | None, priority: int, first: int, count: int) -> None:
    records = []
    for i in range(first, first + count):
        system = {"connectionDeviceId": device, "messageId": f"m-{i}"}
        if module is not None:
            system["connectionModuleId"] = module
        msg = Message(body=json.dumps({"t": i}).encode(), properties={}, system_properties=system)
        records.append(
            record_from_message(
                msg, hub_id="gw", edge_message_id=f"e-{i}", enqueued_at_s=1_795_000_020.0, priority=priority, ttl_s=60.0
            )
        )
    zone.write(SegmentName("gw", "upstream", priority, first, first + count - 1), encode_segment(records))


def test_the_report_counts_rows_per_table_device_priority_and_quarantine_reason(
    spark: SparkSession, tmp_path: Path
) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, "dev1", None, 5, 0, 3)
    _land(zone, "dev2", "filter", 0, 3, 2)
    bad = tmp_path / "landing" / "gw" / "upstream" / "p05" / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b"{not json\n\n"))
    run(spark, job_settings(tmp_path))

    summary = lake_summary(spark, str(tmp_path / "lake"))
    assert summary.rows["bronze"] == 5
    assert summary.rows["silver"] == 5
    assert summary.rows["quarantine"] == 2
    assert summary.per_device == {"dev1": 3, "dev2/filter": 2}
    assert summary.per_priority == {0: 2, 5: 3}
    assert summary.quarantined == {"unparseable_line": 1, "empty_line": 1}
    lines = format_summary(summary, "lake")
    assert "  bronze                  5 rows" in lines
    assert lines.index("bronze rows per priority:") < lines.index("  p0                                        2")


def test_a_lake_with_no_tables_yet_counts_zero_everywhere(spark: SparkSession, tmp_path: Path) -> None:
    summary = lake_summary(spark, str(tmp_path / "lake"))
    assert summary == LakeSummary(rows={"bronze": 0, "quarantine": 0, "silver": 0, "device_minute": 0})
    assert format_summary(summary, "lake")[-1] == "  (none)"


def test_the_report_shows_the_busiest_devices_and_sums_the_rest() -> None:
    many = {f"dev{i:02d}": 100 - i for i in range(25)}
    lines = format_summary(LakeSummary(rows={}, per_device=many), "lake")
    assert "  dev00                                   100" in lines
    assert "  (5 more)                                390" in lines  # 80 + 79 + 78 + 77 + 76
    assert "  dev20" not in "\n".join(lines)
