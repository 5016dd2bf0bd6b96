from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from edgehub.upstream.landing import LandingZone
from edgehub.upstream.segment import SegmentName, SegmentRecord, encode_segment
from spark_upload.job import run
from spark_upload.settings import JobSettings
from spark_upload.standalone import StandaloneCluster

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.timeout(420)]


def _land(landing: Path) -> None:
    zone = LandingZone(str(landing))
    for k in range(4):
        first, last = k * 50, k * 50 + 59  # overlapping batches: 10 duplicates each after the first
        records = [
            SegmentRecord(
                edge_message_id=f"e-{i:05d}",
                hub_id="hub1",
                enqueued_at=f"2026-11-22T21:{i % 60:02d}:06.123Z",
                priority=1,  # a message keeps its priority when it is sent again
                ttl_s=60,
                source="/messages/events",
                body=json.dumps({"n": i}).encode() if i % 7 else b"not json",
                device_id=f"dev{i % 3}",
            )
            for i in range(first, last + 1)
        ]
        zone.write(SegmentName("hub1", "upstream", 1, first, last), encode_segment(records))
    bad = landing / "hub1" / "upstream" / "p09"
    bad.mkdir(parents=True)
    (bad / "bad.jsonl.gz").write_bytes(gzip.compress(b'{"v": 1}\nnot json\n'))


def _table(spark: SparkSession, lake: Path, name: str, *cols: str) -> list[tuple[object, ...]]:
    frame: DataFrame = spark.read.parquet(str(lake / name))
    return sorted(tuple(r) for r in frame.selectExpr(*cols).collect())


def test_the_job_submitted_to_a_standalone_cluster_writes_the_same_tables_as_local_mode(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    _land(landing)
    run(
        spark,
        JobSettings(
            landing=str(landing),
            lake=str(tmp_path / "lake-local"),
            checkpoint=str(tmp_path / "ck-local"),
            print_metrics=False,
        ),
    )

    with StandaloneCluster(work_dir=tmp_path / "cluster", workers=2) as cluster:
        done = cluster.submit(
            [
                "--landing",
                str(landing),
                "--lake",
                str(tmp_path / "lake-cluster"),
                "--checkpoint",
                str(tmp_path / "ck-cluster"),
                "--shuffle-partitions",
                "2",
            ]
        )
    assert "ingest.batch" in done.stdout

    # Which copy of a duplicate survives is arbitrary when both arrive in one batch, so the file it came from is
    # not compared; everything the message carries is.
    bronze_cols = ("edge_message_id", "device_id", "priority", "enqueued_at", "body", "properties", "ttl_s")
    local = _table(spark, tmp_path / "lake-local", "bronze", *bronze_cols)
    assert len(local) == 210
    assert _table(spark, tmp_path / "lake-cluster", "bronze", *bronze_cols) == local
    quarantine_cols = ("reason", "line", "source_file")
    assert _table(spark, tmp_path / "lake-cluster", "quarantine", *quarantine_cols) == _table(
        spark, tmp_path / "lake-local", "quarantine", *quarantine_cols
    )
    silver_cols = ("edge_message_id", "cast(body as string) as body")
    assert _table(spark, tmp_path / "lake-cluster", "silver", *silver_cols) == _table(
        spark, tmp_path / "lake-local", "silver", *silver_cols
    )
