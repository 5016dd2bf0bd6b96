"""The reads of Spark's private layout: they pass on the Spark installed, and refuse loudly on any other layout.

Each test lets the real Spark write a checkpoint, then rewrites one of its files the way another Spark might lay it
out (another log version, a renamed key), and checks the job refuses with ``SparkInternalsError`` naming the file
instead of reading on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pyspark.sql import SparkSession

from edgehub.upstream.landing import LandingZone
from edgehub.upstream.segment import SegmentName, SegmentRecord, encode_segment
from spark_upload.job import run
from spark_upload.spark_internals import CheckpointLog, HadoopDir, SparkInternalsError, check_spark
from tests.spark_upload.checkpoints import forget_batches, job_settings, newest, rewrite

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


def _land(zone: LandingZone, first: int, last: int) -> str:
    records = [
        SegmentRecord(
            edge_message_id=f"e-{i:06d}",
            hub_id="hub1",
            enqueued_at="2026-11-22T21:33:06.123Z",
            priority=3,
            ttl_s=60,
            source="/messages/events",
            body=b"{}",
        )
        for i in range(first, last + 1)
    ]
    name = SegmentName("hub1", "upstream", 3, first, last)
    zone.write(name, encode_segment(records))
    return name.path


def _bronze_count(spark: SparkSession, tmp_path: Path) -> int:
    return spark.read.parquet(str(tmp_path / "lake" / "bronze")).count()


def test_the_installed_spark_and_the_checkpoint_it_writes_pass_every_check(spark: SparkSession, tmp_path: Path) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    first, second = _land(zone, 0, 9), _land(zone, 10, 19)
    # The file source takes the oldest file first; two files written in the same tick of the file system's clock
    # come in either order, so the first is made a minute older.
    landed = (tmp_path / "landing" / first).stat().st_mtime - 60
    os.utime(tmp_path / "landing" / first, (landed, landed))
    key = "spark.sql.streaming.fileSource.log.compactInterval"
    spark.conf.set(key, "2")  # so that a batch's files are found in a .compact log file too
    try:
        run(spark, job_settings(tmp_path, max_files_per_trigger=1))
    finally:
        spark.conf.unset(key)

    check_spark(spark)
    log = CheckpointLog(HadoopDir(spark, str(tmp_path / "checkpoint")))
    log.check()
    assert not log.is_new()
    assert sorted(p.name for p in (tmp_path / "checkpoint" / "sources" / "0").iterdir() if p.suffix == ".compact")
    files = [[Path(urlsplit(f).path).relative_to(tmp_path / "landing") for f in log.batch_files(b)] for b in (0, 1)]
    assert files == [[Path(first)], [Path(second)]]
    marker = json.loads((tmp_path / "lake" / "_committed" / "b0000000000").read_text())
    assert log.query_id() == marker["query_id"] is not None
    (day,) = [p.name for p in (tmp_path / "lake" / "bronze").iterdir()]
    assert day == f"ingest_date={log.batch_at(0).date().isoformat()}"


def test_a_checkpoint_whose_offsets_log_has_another_version_is_refused_before_any_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, 0, 9)
    settings = job_settings(tmp_path)
    run(spark, settings)
    offsets = tmp_path / "checkpoint" / "offsets"
    last = newest(offsets)
    rewrite(last, last.read_text().replace("v1", "v2", 1))
    planned = sorted(offsets.iterdir())
    _land(zone, 10, 19)

    with pytest.raises(SparkInternalsError, match="expected log format v1, found 'v2'") as refused:
        run(spark, settings)
    assert refused.value.path is not None
    assert refused.value.path.endswith(f"offsets/{last.name}")
    assert sorted(offsets.iterdir()) == planned  # no batch was started
    assert _bronze_count(spark, tmp_path) == 10


def test_a_source_log_of_another_version_is_refused_where_it_is_read(spark: SparkSession, tmp_path: Path) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, 0, 9)
    run(spark, job_settings(tmp_path))
    entry = tmp_path / "checkpoint" / "sources" / "0" / "0"
    rewrite(entry, entry.read_text().replace("v1", "v9", 1))

    log = CheckpointLog(HadoopDir(spark, str(tmp_path / "checkpoint")))
    with pytest.raises(SparkInternalsError, match="expected log format v1, found 'v9'") as refused:
        log.batch_files(0)
    assert refused.value.path is not None
    assert refused.value.path.endswith("sources/0/0")
    with pytest.raises(SparkInternalsError, match="v9"):
        log.check()


def test_a_batch_that_meets_another_layout_fails_the_run_with_our_error_and_writes_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Batch 1 is replayed (its commit and marker are gone), and reads batch 0's offsets to know which files it
    # read. Batch 0's metadata lacks batchTimestampMs, as in a Spark that renamed it: Spark itself reads on (the
    # field has a default), the start-up check reads only the newest offsets, so the batch is where it is met.
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, 0, 9)
    _land(zone, 10, 19)
    settings = job_settings(tmp_path, max_files_per_trigger=1)
    run(spark, settings)
    checkpoint = tmp_path / "checkpoint"
    forget_batches(checkpoint, commits_from=1, offsets_from=2)
    (tmp_path / "lake" / "_committed" / "b0000000001").unlink()
    for part in (tmp_path / "lake" / "bronze").glob("*/part-b0000000001-*"):
        part.unlink()
    lines = (checkpoint / "offsets" / "0").read_text().splitlines()
    meta = json.loads(lines[1])
    meta["batchTimestampMillis"] = meta.pop("batchTimestampMs")
    rewrite(checkpoint / "offsets" / "0", "\n".join([lines[0], json.dumps(meta), *lines[2:]]))

    with pytest.raises(SparkInternalsError, match="'batchTimestampMs' of type int") as refused:
        run(spark, settings)
    assert refused.value.path is not None
    assert refused.value.path.endswith("offsets/0")
    assert not (tmp_path / "lake" / "_committed" / "b0000000001").exists()
    assert _bronze_count(spark, tmp_path) == 10


def test_the_command_refuses_a_checkpoint_of_another_layout_with_a_line_and_status_2(
    spark: SparkSession, tmp_path: Path
) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, 0, 9)
    run(spark, job_settings(tmp_path))
    offsets = tmp_path / "checkpoint" / "offsets"
    last = newest(offsets)
    rewrite(last, last.read_text().replace("v1", "v2", 1))

    # Its own process: main() stops the session it gets, which in this one is the tests' shared session.
    done = subprocess.run(
        [
            *(sys.executable, "-m", "spark_upload.job", "--master", "local[1]", "--shuffle-partitions", "1"),
            *("--landing", str(tmp_path / "landing"), "--lake", str(tmp_path / "lake")),
            *("--checkpoint", str(tmp_path / "checkpoint")),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    (refusal,) = [line for line in done.stderr.splitlines() if line.startswith("ingest.refused")]
    assert "error=SparkInternalsError" in refusal
    assert f"offsets/{last.name}: expected log format v1, found 'v2'" in refusal
    assert "Traceback" not in done.stderr
