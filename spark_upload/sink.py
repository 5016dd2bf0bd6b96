"""The idempotent sink: each micro-batch's rows into the lake's tables exactly once, however often it is replayed.

A batch is written to ``_staging/{tag}`` (``tag`` is ``b{batch:010d}``), its files are moved into the tables under
names carrying the tag (``spark_upload.tables.move_in``), and a marker ``_committed/{tag}`` holding the counts and
the query id is written last.

Invariants:

* **Exactly once across restarts.** The checkpoint (offsets, dedup state) decides what each batch holds, and
  replaying a batch gives the same rows. A batch with a marker is skipped (its plan still runs into the no-op sink,
  so its dedup state is committed); one without first deletes any files a half-done attempt moved in, then writes
  again.
* **One checkpoint per lake.** Markers are keyed by batch id, and a new checkpoint starts again at batch 0, so
  ``open_run`` refuses (``CheckpointMismatchError``) when the lake has markers and the checkpoint is new, or when
  the newest marker names another query than the checkpoint's.
* **Nothing is skipped silently.** The landing source reads with ``ignoreCorruptFiles`` (without it a segment whose
  gzip stream is broken fails the batch, and every replay of it), so each batch checks the gzip stream of every
  file it read (which ones: the checkpoint, ``CheckpointLog.batch_files``) and quarantines each broken one as
  ``unreadable_file``. Both are a function of the batch, so a replay quarantines the same files.
* **A batch is computed once** (read, classification, dedup state): one write stages all its rows in bronze's layout
  (``_staged``; a bad row carries its reason and line in two of bronze's columns) and counts both outcomes
  (``observe``); every table is then derived from the staged files. Nothing is cached, and a batch with bad lines
  is split by reading its staged files, not by computing it again.
* A batch has one ingest time, so one ``ingest_date``: the tables are staged unpartitioned and moved into the day's
  partition (``partitionBy`` would sort every row by a constant).
* An error of ours raised inside a batch is kept in ``RunState.failure``, since Spark hands the caller only its own
  wrapper of it.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.listener import StreamingQueryListener

from edgehub.core import ConfigurationError, EdgeHubError
from spark_upload.classification import BRONZE_COLUMNS
from spark_upload.decoding import SegmentDecoder
from spark_upload.settings import JobSettings
from spark_upload.spark_internals import CheckpointLog, HadoopDir, gzip_error
from spark_upload.tables import TABLES, device_minute_partials, move_in, silver, write_capped

__all__ = ["BatchCounts", "CheckpointMismatchError", "RunState", "batch_tag", "open_run", "write_batch"]

_log = logging.getLogger(__name__)

# The quarantine table's columns, and so the schema of the rows for unreadable files.
_QUARANTINE_COLUMNS = (
    ("reason", "string"),
    ("source_file", "string"),
    ("line", "string"),
    ("edge_message_id", "string"),
    ("ingest_at", "timestamp"),
)
# Bronze columns a staged bad row keeps as they are (``_staged``).
_STAGED_AS_IS = frozenset({"edge_message_id", "source_file", "ingest_at"})


class CheckpointMismatchError(ConfigurationError):
    """The lake holds batches committed by another query than the checkpoint's; the job refuses to start.

    Batch ids restart at 0 with a new checkpoint, and the sink skips a batch whose marker is already in the lake,
    so running on would silently drop new data whose batch ids collide with old markers (and read every landing
    file again). ``lake`` and ``checkpoint`` say which pair was refused.
    """

    def __init__(self, message: str, *, lake: str, checkpoint: str) -> None:
        super().__init__(message)
        self.lake = lake
        self.checkpoint = checkpoint


def batch_tag(batch_id: int) -> str:
    """The name of a batch in the lake's bookkeeping and file names; sorts by batch id."""
    return f"b{batch_id:010d}"


@dataclass(slots=True)
class BatchCounts:
    bronze: int = 0
    quarantined: int = 0  # lines, and files that could not be read
    unreadable_files: int = 0
    skipped_replay: bool = False


@dataclass(slots=True)
class RunState:
    """What one run of the query has done, shared by the batch thread, the metrics listener and the caller."""

    settings: JobSettings
    lake: HadoopDir
    checkpoint: CheckpointLog
    counts: dict[int, BatchCounts] = field(default_factory=dict)
    emitted: set[int] = field(default_factory=set)
    lock: threading.Condition = field(default_factory=threading.Condition)
    metrics_file: str | None = None
    listener: StreamingQueryListener | None = None
    query_id: str | None = None  # from the checkpoint's metadata; goes into every commit marker
    failure: EdgeHubError | None = None  # an error of ours that failed a batch
    decoder: SegmentDecoder | None = None  # decodes zstd segments for the query while it runs (continuous)

    def wait_for_batches(self, n: int, *, timeout_s: float) -> bool:
        """Block until ``n`` batches were handled by this run (committed or skipped); False on timeout."""
        with self.lock:
            return self.lock.wait_for(lambda: len(self.counts) >= n, timeout=timeout_s)

    def wait_for_progress(self, n: int, *, timeout_s: float) -> bool:
        """Block until ``n`` batches of this run reported progress, which Spark does once a batch is in the
        checkpoint's commit log; False on timeout."""
        with self.lock:
            return self.lock.wait_for(lambda: len(self.emitted) >= n, timeout=timeout_s)


def open_run(spark: SparkSession, settings: JobSettings) -> RunState:
    """The state of a new run on ``settings``' lake and checkpoint, once both are found fit.

    Raises ``SparkInternalsError`` when the checkpoint is laid out otherwise than this job reads it, and
    ``CheckpointMismatchError`` when the lake holds batches committed by another checkpoint's query.
    """
    lake = HadoopDir(spark, settings.lake)
    checkpoint = CheckpointLog(HadoopDir(spark, settings.checkpoint))
    checkpoint.check()
    _refuse_a_checkpoint_that_did_not_write_the_lake(lake, checkpoint)
    return RunState(settings=settings, lake=lake, checkpoint=checkpoint)


def _refuse_a_checkpoint_that_did_not_write_the_lake(lake: HadoopDir, checkpoint: CheckpointLog) -> None:
    markers = lake.glob("_committed/b*")
    if not markers:
        return
    if checkpoint.is_new():
        raise CheckpointMismatchError(
            f"lake {lake.root} holds {len(markers)} committed batches but checkpoint {checkpoint.root} is new: "
            "its batch ids would collide with the lake's commit markers and new data would be skipped. Run with "
            "the checkpoint that wrote this lake, or write to a new lake.",
            lake=lake.root,
            checkpoint=checkpoint.root,
        )
    text = lake.read_text(markers[-1])
    lake_query = json.loads(text).get("query_id") if text else None
    ours = checkpoint.query_id()
    if lake_query is not None and lake_query != ours:
        raise CheckpointMismatchError(
            f"lake {lake.root} was written by query {lake_query}, but checkpoint {checkpoint.root} belongs to query "
            f"{ours}: their batch ids do not match. Run with the checkpoint that wrote this lake, or write to a new "
            "lake.",
            lake=lake.root,
            checkpoint=checkpoint.root,
        )


def _unreadable_files(spark: SparkSession, run: RunState, batch_id: int) -> tuple[DataFrame | None, int]:
    """One quarantine row per file of the batch that is not a whole gzip stream (None when there is none), and
    how many."""
    broken = []
    for path in run.checkpoint.batch_files(batch_id):
        error = gzip_error(spark, path)
        if error is not None:
            _log.warning("ingest.unreadable_file batch=%d file=%s error=%s", batch_id, path, error)
            broken.append(path)
    if not broken:
        return None, 0
    ingest_at = run.checkpoint.batch_at(batch_id)
    rows = [("unreadable_file", path, None, None, ingest_at) for path in broken]
    schema = ", ".join(f"{name} {kind}" for name, kind in _QUARANTINE_COLUMNS)
    return spark.createDataFrame(rows, schema), len(broken)


def write_batch(run: RunState, batch: DataFrame, batch_id: int) -> None:
    """The ``foreachBatch`` function: write micro-batch ``batch_id`` into the lake once (see the invariants)."""
    try:
        _write_batch(run, batch, batch_id)
    except EdgeHubError as exc:
        run.failure = exc
        raise


def _staged(rows: DataFrame) -> DataFrame:
    """The batch in bronze's layout, every row of it: a good row as it goes to bronze, a bad one with a null ``v``
    (a good row's is 1 or 2), its reason in ``source`` and its line, byte for byte, in ``body`` (see
    ``_quarantined``); of its other fields only ``edge_message_id``, ``source_file`` and ``ingest_at`` (the quarantine
    has them). So one write stages the whole batch, and when it has no bad row the staged files are bronze's."""
    bad = F.col("reason").isNotNull()
    carried = {"source": F.col("reason"), "body": F.col("line").cast(T.BinaryType())}
    columns = []
    for name in BRONZE_COLUMNS[:-1]:  # ingest_date is the folder
        if name in _STAGED_AS_IS:
            columns.append(F.col(name))
        elif name in carried:
            columns.append(F.when(bad, carried[name]).otherwise(F.col(name)).alias(name))
        else:
            columns.append(F.when(~bad, F.col(name)).alias(name))
    return rows.select(*columns)


def _quarantined(staged: DataFrame) -> DataFrame:
    """The quarantine rows of a staged batch (``_staged``)."""
    return staged.where(F.col("v").isNull()).select(
        F.col("source").alias("reason"),
        "source_file",
        F.col("body").cast(T.StringType()).alias("line"),
        "edge_message_id",
        "ingest_at",
    )


def _write_batch(run: RunState, batch: DataFrame, batch_id: int) -> None:
    lake, settings = run.lake, run.settings
    spark = batch.sparkSession
    tag = batch_tag(batch_id)
    if lake.exists("_committed", tag):
        _log.info("ingest.batch_replay_skipped batch=%d", batch_id)
        # The rows are already in the tables, but the dedup state of this batch must still be committed, and
        # Spark checks that every state partition was: run the plan into the no-op sink.
        batch.write.format("noop").mode("overwrite").save()
        with run.lock:
            run.counts[batch_id] = BatchCounts(skipped_replay=True)
            run.lock.notify_all()
        return
    # A half-done earlier attempt may have moved some files in: take them out before writing again.
    for table in TABLES:
        for leftover in lake.glob(f"{table}/*/part-{tag}-*"):
            lake.delete(leftover)
    lake.delete("_staging", tag)

    day = run.checkpoint.batch_at(batch_id).date().isoformat()

    def stage(table: str, frame: DataFrame) -> DataFrame:
        """Write ``frame`` to ``_staging/{tag}/{table}``; returns a reader of what was written (its schema given,
        so reading it starts no Spark job to infer one)."""
        uri = lake.uri("_staging", tag, table)
        write_capped(frame, uri, max_records_per_file=settings.max_records_per_file)
        return spark.read.schema(frame.schema).parquet(uri)

    # The batch (read, classification, dedup state) is computed once, by one write that stages all of it in
    # bronze's layout, counting both outcomes on the way. It is not cached: building an in-memory copy of a
    # million rows cost about as much as writing them, and every table below reads the staged files instead.
    tally = Observation()
    good_bad = (
        F.count(F.when(F.col("reason").isNull(), 1)).alias("good"),
        F.count(F.when(F.col("reason").isNotNull(), 1)).alias("bad"),
    )
    staged = stage("batch", _staged(batch.observe(tally, *good_bad)))
    good, bad_lines = int(tally.get["good"]), int(tally.get["bad"])
    unreadable, n_unreadable = _unreadable_files(spark, run, batch_id)
    counts = BatchCounts(bronze=good, quarantined=bad_lines + n_unreadable, unreadable_files=n_unreadable)
    bronze, bronze_folder = staged, "batch"  # without bad lines, the staged batch is bronze
    if bad_lines:
        # Rare: the staged batch is split (a Parquet read of it, not the batch computed again).
        bad = _quarantined(staged)
        if unreadable is not None:
            bad = bad.unionByName(unreadable)
        stage("quarantine", bad)
        if good:
            bronze, bronze_folder = stage("bronze", staged.where(F.col("v").isNotNull())), "bronze"
    elif unreadable is not None:
        stage("quarantine", unreadable)
    if good:
        # From the staged silver: the bodies are parsed once, not again for the aggregate.
        staged_silver = stage("silver", silver(bronze))
        stage("device_minute", device_minute_partials(staged_silver, batch_id))
        move_in(lake, lake.glob(f"_staging/{tag}/{bronze_folder}/part-*"), "bronze", day, tag=tag)
    for table in TABLES:
        if table != "bronze":  # its files were moved in above
            move_in(lake, lake.glob(f"_staging/{tag}/{table}/part-*"), table, day, tag=tag)
    if run.query_id is None:
        run.query_id = run.checkpoint.query_id()
    marker = {"bronze": counts.bronze, "quarantined": counts.quarantined, "query_id": run.query_id}
    lake.touch("_committed", tag, text=json.dumps(marker))
    lake.delete("_staging", tag)
    with run.lock:
        run.counts[batch_id] = counts
        run.lock.notify_all()
