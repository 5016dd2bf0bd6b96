"""The cloud ingestion job: landing zone segments to lake tables, exactly once.

Usage:
    python -m spark_upload.job --landing URL --lake DIR --checkpoint DIR \\
        [--trigger available-now|continuous] [--master local[2]]
    spark-submit --master spark://HOST:7077 --py-files edgehub-job.zip spark_upload/job.py \\
        --landing URL --lake DIR --checkpoint DIR --trigger available-now
    python -m spark_upload.job compact --lake DIR [--older-than-days 2] [--max-records-per-file N]

What it does, per micro-batch of new landing files (Structured Streaming, built-in text source; gzip is
decoded by the file source from the ``.gz`` suffix; zstd segments, ``*.jsonl.zst``, with or without a dictionary,
are first decoded by the driver into gzip copies under ``decoded/``, which the source reads like any segment:
``spark_upload.decoding``):

* every line is classified: a good record (record format v1 or v2, in any mix) goes to **bronze** (all segment
  fields typed, the body decoded to bytes, v2's left-out system properties put back, ``v`` as written), anything
  else to **quarantine** with a ``reason`` and its ``source_file``: ``empty_line``, ``unparseable_line`` (not
  JSON or not an object), ``unsupported_version`` (``v`` not 1 or 2), ``malformed_record`` (a field of the wrong
  type), ``missing_fields:a,b`` (required field absent or null; ``body`` in v1), ``bad_enqueued_at``,
  ``no_body_field`` and ``several_body_fields`` (v2: not exactly one of ``body_json``, ``body_text``,
  ``body_b64``), ``body_json_not_last`` (v2: the body's text cannot be cut from the line), ``body_not_base64``
  (v1 ``body``, v2 ``body_b64``), ``undecodable_segment`` (a zstd segment that could not be decoded: its line
  says which segment, why and with which dictionary id). Nothing is dropped silently;
* records whose ``(hub_id, edge_message_id)`` was already seen within the dedup window are removed
  (``dropDuplicatesWithinWatermark`` over the ingest time, which is the micro-batch time and so never "late");
* **silver** is bronze with the body parsed to a VARIANT (``parse_json``; null when the body is not JSON, which
  is legal: bodies are bytes) and device, module, priority and times as columns;
* **device_minute** holds partial aggregates per batch (per device and minute and numeric top-level body field:
  count, sum, min, max) that ``device_minute_stats`` combines into count/min/max/avg;
* one JSON line of metrics per batch (input, bronze, duplicates, quarantined, unreadable files) goes to
  ``{lake}/_metrics/b{batch}-{time}.jsonl`` through the lake's Hadoop FS (so to object storage too: one small
  file per batch, since object stores cannot append), to stdout, and optionally to a local ``--metrics`` file.

Where each part lives, with its invariants (this file holds the command line and the wiring of the query):

* ``spark_upload.decoding``: zstd segments to gzip copies the query reads (dictionaries from the landing zone's
  ``dictionaries/``; an undecodable segment becomes one quarantined line, never a failed job);
* ``spark_upload.classification``: lines to typed rows or a quarantine reason, and the dedup step;
* ``spark_upload.sink``: the idempotent sink (exactly once across restarts; one checkpoint per lake, else
  ``CheckpointMismatchError``; unreadable files quarantined);
* ``spark_upload.tables``: the tables' layout (Parquet partitioned by ``ingest_date``, UTC; ``_``/``.`` names are
  bookkeeping), silver and device_minute; ``spark_upload.compaction``: ``compact``;
* ``spark_upload.metrics``: the per-batch metrics line;
* ``spark_upload.spark_internals``: every read of what Spark does not promise (the checkpoint's files, the driver's
  JVM). A Spark, or a checkpoint, laid out otherwise than the job reads is refused (``SparkInternalsError``): the
  command exits with status 2 and an ``ingest.refused`` line, as it does for a checkpoint mismatch.

Shipping: run as ``spark-submit spark_upload/job.py``, this file imports its sibling modules and
``edgehub.upstream.segment``, so the driver needs both packages (``--py-files`` with a zip of ``spark_upload`` and
``edgehub``; docs/spark.md, "Submit it to a cluster"), and ``zstandard`` installed (for zstd segments). Executors
need none of them: every row is handled by Spark column expressions, and the sink's and the decoder's Python runs
in the driver.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from spark_upload.classification import classify, deduplicated, read_landing
from spark_upload.compaction import compact
from spark_upload.decoding import SegmentDecoder
from spark_upload.metrics import MetricsListener, driver_cpu_s, emit_metrics, local_metrics_file
from spark_upload.settings import (
    DEDUP_WINDOW,
    MAX_RECORDS_PER_FILE,
    PROCESSING_INTERVAL,
    TRIGGERS,
    JobSettings,
    build_session,
)
from spark_upload.sink import CheckpointMismatchError, RunState, open_run, write_batch
from spark_upload.spark_internals import HadoopDir, HadoopIOError, SparkInternalsError, check_spark
from spark_upload.tables import device_minute_stats

# The job's public face; each name has its home module, listed in the docstring.
__all__ = [
    "CheckpointMismatchError",
    "JobSettings",
    "RunState",
    "SparkInternalsError",
    "build_session",
    "compact",
    "device_minute_stats",
    "finish",
    "main",
    "run",
    "start",
]


def start(spark: SparkSession, settings: JobSettings) -> tuple[StreamingQuery, RunState]:
    """Start the streaming query; the caller waits on it and must stop it.

    Raises ``SparkInternalsError`` when this Spark, or the checkpoint, is not laid out as the job reads it, and
    ``CheckpointMismatchError`` when the lake holds batches committed by another checkpoint's query.
    """
    check_spark(spark)
    run = open_run(spark, settings)
    run.metrics_file = local_metrics_file(settings)
    # zstd segments get their gzip copies before the query lists the landing zone; under the continuous trigger,
    # again every decode_interval_s while it runs.
    decoder = SegmentDecoder(HadoopDir(spark, settings.landing))
    decoder.run_pass()
    if settings.trigger == "continuous":
        decoder.start(settings.decode_interval_s)
    run.decoder = decoder
    lines = read_landing(spark, settings.landing, max_files_per_trigger=settings.max_files_per_trigger)
    stream = deduplicated(classify(lines), settings.dedup_window)
    writer = stream.writeStream.option("checkpointLocation", settings.checkpoint).foreachBatch(
        lambda df, batch_id: write_batch(run, df, batch_id)
    )
    if settings.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=settings.processing_interval)
    query_id: list[str] = []
    listener = MetricsListener(run, query_id)
    spark.streams.addListener(listener)
    query = writer.start()
    query_id.append(str(query.id))
    run.listener = listener
    return query, run


def finish(spark: SparkSession, query: StreamingQuery, run: RunState) -> None:
    """Stop decoding, emit metrics the listener has not delivered yet, then drop the listener."""
    if run.decoder is not None:
        run.decoder.stop()
    for progress in query.recentProgress:
        emit_metrics(run, json.loads(progress.json))
    if run.listener is not None:
        spark.streams.removeListener(run.listener)
        run.listener = None


def run(spark: SparkSession, settings: JobSettings) -> None:
    """Run the job until the landing zone is drained (available-now) or until interrupted (continuous).

    An error of ours that failed a batch (``SparkInternalsError`` among them) is raised as itself, not as Spark's
    ``StreamingQueryException`` around it.
    """
    query, state = start(spark, settings)
    try:
        query.awaitTermination()
    except StreamingQueryException as exc:
        if state.failure is not None:
            raise state.failure from exc
        raise
    finally:
        query.stop()
        finish(spark, query, state)


# --- command line -------------------------------------------------------------------------------------------


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    if argv and argv[0] == "compact":
        p = argparse.ArgumentParser(prog="python -m spark_upload.job compact", description=compact.__doc__)
        p.add_argument("--lake", required=True)
        p.add_argument("--older-than-days", type=int, default=2)
        p.add_argument("--max-records-per-file", type=int, default=MAX_RECORDS_PER_FILE)
        p.add_argument("--master", default=None)
        ns = p.parse_args(list(argv[1:]))
        ns.command = "compact"
        return ns
    p = argparse.ArgumentParser(prog="python -m spark_upload.job", description=__doc__.split("\n\n")[0])
    p.add_argument("--landing", required=True, help="landing zone folder or URL (file://, s3a://, abfss://)")
    p.add_argument("--lake", required=True, help="where the tables go")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint location")
    p.add_argument("--trigger", choices=TRIGGERS, default=TRIGGERS[0])
    p.add_argument("--master", default=None, help="e.g. local[2]; omitted under spark-submit")
    p.add_argument("--processing-interval", default=PROCESSING_INTERVAL)
    p.add_argument("--dedup-window", default=DEDUP_WINDOW)
    p.add_argument("--max-records-per-file", type=int, default=MAX_RECORDS_PER_FILE)
    p.add_argument("--max-files-per-trigger", type=int, default=None)
    p.add_argument("--shuffle-partitions", type=int, default=8)
    p.add_argument(
        "--driver-memory",
        default=None,
        help="heap of the JVM this command starts (local mode: it holds the executors too), e.g. 4g; under "
        "spark-submit pass spark-submit's own --driver-memory instead",
    )
    p.add_argument("--metrics", default=None, help="also append each batch's line to this local JSON lines file")
    ns = p.parse_args(list(argv))
    ns.command = "ingest"
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if ns.command == "compact":
        spark = build_session(master=ns.master, app_name="edgehub-compact")
        try:
            before = (datetime.now(UTC) - timedelta(days=ns.older_than_days)).date().isoformat()
            done = compact(spark, ns.lake, before=before, max_records_per_file=ns.max_records_per_file)
            print(json.dumps({"compacted": done}))
        except SparkInternalsError as exc:
            return _refused(exc)
        finally:
            spark.stop()
        return 0
    settings = JobSettings(
        landing=ns.landing,
        lake=ns.lake,
        checkpoint=ns.checkpoint,
        trigger=ns.trigger,
        processing_interval=ns.processing_interval,
        dedup_window=ns.dedup_window,
        max_records_per_file=ns.max_records_per_file,
        max_files_per_trigger=ns.max_files_per_trigger,
        metrics_path=ns.metrics,
    )
    extra_conf = {} if ns.driver_memory is None else {"spark.driver.memory": ns.driver_memory}
    spark = build_session(master=ns.master, shuffle_partitions=ns.shuffle_partitions, extra_conf=extra_conf)
    spark.sparkContext.setLogLevel("WARN")
    try:
        check_spark(spark)
        started, cpu_started = time.perf_counter(), driver_cpu_s(spark)
        run(spark, settings)
        elapsed_s, cpu_s = time.perf_counter() - started, driver_cpu_s(spark) - cpu_started
        # CPU seconds of this driver (its JVM, which holds the executors in local mode, and Python) during the
        # run: cpu_s / elapsed_s is how many cores the run kept busy.
        print(f"ingest.run_done elapsed_s={elapsed_s:.3f} cpu_s={cpu_s:.3f}", flush=True)
    except (CheckpointMismatchError, SparkInternalsError, HadoopIOError) as exc:
        return _refused(exc)
    finally:
        spark.stop()
    return 0


def _refused(exc: Exception) -> int:
    """A refusal to run is a line on stderr and exit status 2, never a traceback."""
    print(f"ingest.refused error={type(exc).__name__} {exc}", file=sys.stderr, flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
