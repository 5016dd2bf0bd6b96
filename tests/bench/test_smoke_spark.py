"""``bench.ingest_spark`` at a smoke size, run as a user runs it: a landing zone of 2,000 records in two segments (the
second repeating the first's last 50), the whole job at local[1] and its floor (``bench.spark_floor``) on it, each
pinned to one core as in a full run. Its own checks: the job's counts add up (every line read, every record in bronze
once, the repeats dropped as duplicates, nothing quarantined) and the floor wrote one row per input line. The
local[2], unpinned and standalone runs are left out (``--modes``, ``--no-cluster``): they run the same code with
another master, and the job on a standalone cluster has a test of its own (``tests/spark_upload/test_cluster.py``)."""

from __future__ import annotations

import pytest

from tests.bench.bench_process import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(180)]


def test_ingest_spark_runs_the_job_which_keeps_every_record_once_and_its_floor_a_row_for_every_line() -> None:
    records = 2000
    figures = run_bench(
        "ingest_spark",
        *("--records", str(records), "--segment-records", "1000", "--repeat", "1"),
        *("--no-cluster", "--modes", "local1,floor"),
        timeout_s=170,
    )
    assert {
        "records",
        "input_lines",
        "records_per_s_local1",
        "records_per_s_local2",
        "scaling_ratio",
        "floor_records_per_s_local1",
        "job_over_floor",
        "elapsed_s",
        "standalone_records_per_s",
    } <= set(figures)
    assert figures["records"] == records
    assert figures["input_lines"] == records + 50  # the second segment repeats the first's last 50 (5 %)
    assert set(figures["elapsed_s"]) == {"local[1]", "floor local[1]"}
    assert figures["records_per_s_local2"] is None  # left out, so null rather than made up


@pytest.mark.timeout(330)  # two JVMs (the job, then the lake's reader) on a loaded 2-core box
def test_links_counts_lost_and_duplicates_in_the_lake_the_spark_job_built() -> None:
    # The same run as the links smoke test, its lake built by the Spark job (local[2]) and read back.
    figures = run_bench(
        "links",
        *("--warm-s", "2", "--cut-s", "2", "--silent-s", "2", "--after-s", "4", "--settle-s", "1", "--lake", "spark"),
        *("--telemetry-per-s", "5", "--drain-max-s", "30", "--only", "edgehub"),
        timeout_s=320,
    )
    assert figures["lake"] == "spark"
    assert figures["lost"] == 0
    assert figures["duplicates"] == 0
    assert figures["lake_rows"] == figures["published"]


@pytest.mark.timeout(400)  # two runs of the job, each its own JVM
def test_upload_codec_runs_the_job_on_gzip_and_on_zstd_dictionary_segments_with_every_message_once() -> None:
    # --spark: the job's run on each landing zone is checked to put every message in bronze once.
    figures = run_bench("upload_codec", "--messages", "400", "--batch", "50", "--spark", timeout_s=380)
    assert {"job_gzip_s", "job_zstd_dict_s"} <= set(figures)
    assert figures["segments_with_dictionary"] > 0
