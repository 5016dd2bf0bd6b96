"""The cloud ingestion job: landing zone segments to lake tables, exactly once.

Usage:
    python -m spark_upload.job --landing URL --lake DIR --checkpoint DIR \\
        [--trigger available-now|continuous] [--master local[2]]
    spark-submit --master spark://HOST:7077 spark_upload/job.py \\
        --landing URL --lake DIR --checkpoint DIR --trigger available-now
    python -m spark_upload.job compact --lake DIR [--older-than-days 2] [--max-records-per-file N]

What it does, per micro-batch of new landing files (Structured Streaming, built-in text source; gzip is
decoded by the file source from the ``.gz`` suffix):

* every line is classified: a good record (record format v1 or v2, in any mix) goes to **bronze** (all segment
  fields typed, the body decoded to bytes, v2's left-out system properties put back, ``v`` as written), anything
  else to **quarantine** with a ``reason`` and its ``source_file``: ``empty_line``, ``unparseable_line`` (not
  JSON or not an object), ``unsupported_version`` (``v`` not 1 or 2), ``malformed_record`` (a field of the wrong
  type), ``missing_fields:a,b`` (required field absent or null; ``body`` in v1), ``bad_enqueued_at``,
  ``no_body_field`` and ``several_body_fields`` (v2: not exactly one of ``body_json``, ``body_text``,
  ``body_b64``), ``body_json_not_last`` (v2: the body's text cannot be cut from the line), ``body_not_base64``
  (v1 ``body``, v2 ``body_b64``). Nothing is dropped silently;
* records whose ``(hub_id, edge_message_id)`` was already seen within the dedup window are removed
  (``dropDuplicatesWithinWatermark`` over the ingest time, which is the micro-batch time and so never "late");
* **silver** is bronze with the body parsed to a VARIANT (``parse_json``; null when the body is not JSON, which
  is legal: bodies are bytes) and device, module, priority and times as columns;
* **device_minute** holds partial aggregates per batch (per device and minute and numeric top-level body field:
  count, sum, min, max) that ``device_minute_stats`` combines into count/min/max/avg;
* one JSON line of metrics per batch (input, bronze, duplicates, quarantined, unreadable files) goes to
  ``{lake}/_metrics/b{batch}-{time}.jsonl`` through the lake's Hadoop FS (so to object storage too: one small
  file per batch, since object stores cannot append), to stdout, and optionally to a local ``--metrics`` file.

Invariants:

* **Exactly once across restarts.** The checkpoint (offsets, dedup state) decides what each batch holds, and
  replaying a batch gives the same rows. The sink is idempotent: a batch is written to ``_staging/{batch}``,
  its files are moved into the tables under names carrying the batch id (``part-b{batch}-...``), and a marker
  ``_committed/{batch}`` (holding the query id) is written last. A batch with a marker is skipped; one without
  first deletes any files a half-done attempt moved in, then writes again.
* **One checkpoint per lake.** Markers are keyed by batch id, and a new checkpoint starts again at batch 0, so
  the job refuses to start (``CheckpointMismatchError``) when the lake has markers and the checkpoint is new,
  or when the newest marker names another query than the checkpoint's.
* Tables are Parquet partitioned by ``ingest_date`` (UTC); files hold at most ``max_records_per_file`` rows;
  ``compact`` rewrites partitions older than N days into fewer files (run it when the job is not writing to
  those partitions; it never touches today's).
* Names starting with ``_`` or ``.`` inside the lake are bookkeeping; Spark readers skip them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.listener import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery

from edgehub.core import ConfigurationError
from edgehub.upstream.segment import (
    BODY_FIELDS,
    COLUMN_SYSTEM_PROPERTIES,
    READ_VERSIONS,
    RECORD_FIELDS,
    SEGMENT_SUFFIX,
)

__all__ = [
    "BRONZE_COLUMNS",
    "RECORD_SCHEMA",
    "REQUIRED_FIELDS",
    "CheckpointMismatchError",
    "JobSettings",
    "RunState",
    "build_session",
    "compact",
    "device_minute_stats",
    "finish",
    "main",
    "run",
    "start",
]

_log = logging.getLogger(__name__)

# A segment line of any version we read, field for field (edgehub.upstream.segment.LINE_FIELDS: the v1 fields, then
# the v2 body fields; a test keeps them in step). body_json may hold any JSON value: a string column gets its text.
RECORD_SCHEMA = T.StructType(
    [
        T.StructField("v", T.IntegerType()),
        T.StructField("edge_message_id", T.StringType()),
        T.StructField("message_id", T.StringType()),
        T.StructField("device_id", T.StringType()),
        T.StructField("module_id", T.StringType()),
        T.StructField("hub_id", T.StringType()),
        T.StructField("enqueued_at", T.StringType()),
        T.StructField("priority", T.IntegerType()),
        T.StructField("ttl_s", T.DoubleType()),
        T.StructField("source", T.StringType()),
        T.StructField("properties", T.MapType(T.StringType(), T.StringType(), valueContainsNull=True)),
        T.StructField("system_properties", T.MapType(T.StringType(), T.StringType(), valueContainsNull=True)),
        T.StructField("body", T.StringType()),
        T.StructField("body_json", T.StringType()),
        T.StructField("body_text", T.StringType()),
        T.StructField("body_b64", T.StringType()),
    ]
)
# Required in every version; v1 requires body too, v2 exactly one of BODY_FIELDS.
REQUIRED_FIELDS: tuple[str, ...] = ("edge_message_id", "hub_id", "enqueued_at", "priority", "ttl_s", "source")
_BODY_JSON_KEY = '"body_json":'
_TOMBSTONE_KEYS = [key for key, _ in COLUMN_SYSTEM_PROPERTIES]
_CORRUPT = "_corrupt_record"
_PARSE_SCHEMA = T.StructType([*RECORD_SCHEMA.fields, T.StructField(_CORRUPT, T.StringType())])
_ENQUEUED_AT_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSX"
_NUMERIC_VARIANT = r"^(TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL)"

# Bronze keeps every segment field, then where and when it was ingested.
BRONZE_COLUMNS: tuple[str, ...] = (*RECORD_FIELDS, "source_file", "ingest_at", "ingest_date")
_TABLES = ("bronze", "quarantine", "silver", "device_minute")


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


@dataclass(frozen=True, slots=True)
class JobSettings:
    """Where the job reads and writes, and how it batches. Paths are Hadoop paths or URLs."""

    landing: str
    lake: str
    checkpoint: str
    trigger: str = "available-now"  # or "continuous": a micro-batch every processing_interval
    processing_interval: str = "10 seconds"
    dedup_window: str = "6 hours"
    max_records_per_file: int = 500_000
    max_files_per_trigger: int | None = None
    metrics_path: str | None = None  # also append the lines to this local file ({lake}/_metrics/ gets them anyway)
    print_metrics: bool = True

    def __post_init__(self) -> None:
        if self.trigger not in ("available-now", "continuous"):
            raise ValueError(f"trigger must be available-now or continuous, not {self.trigger!r}")
        if self.max_records_per_file <= 0:
            raise ValueError("max_records_per_file must be positive")


def build_session(
    *,
    master: str | None = None,
    app_name: str = "edgehub-ingest",
    shuffle_partitions: int = 8,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """A session with the settings the job relies on (UTC, RocksDB state). ``master=None`` keeps spark-submit's.

    ``extra_conf`` is applied last, so it can override any of these.
    """
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.ui.showConsoleProgress": "false",
        # Segments are small gzip files (~230 KB holding ~4 MB of JSON) that cannot be split. With the default
        # 128 MB per input partition and 4 MB counted per file opened, a 100-file batch became 4 partitions of
        # 31/31/31/7 files: two cores finish unevenly and more cores sit idle. 16 MB gives ~4 files a partition.
        "spark.sql.files.maxPartitionBytes": "16m",
        **(extra_conf or {}),
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


# --- classification ---------------------------------------------------------------------------------------


def _missing_fields(rec: Column) -> Column:
    names = [F.when(rec[name].isNull(), F.lit(name)) for name in REQUIRED_FIELDS]
    names.append(F.when((rec["v"] == 1) & rec["body"].isNull(), F.lit("body")))
    return F.concat_ws(",", *names)


def _v2_body(value: Column, r: Column) -> Column:
    """A v2 record's body bytes, null when its one body field does not decode. body_json is the text after the line's
    first ``"body_json":`` up to its closing brace (edgehub.upstream.segment's docstring); wrapped in brackets it
    parses only when that cut is the value (the record's last field): parse_json ignores text after a value, but
    not a stray brace or ``,"key":`` inside an array."""
    line = F.rtrim(value)
    start = F.locate(_BODY_JSON_KEY, line) + F.lit(len(_BODY_JSON_KEY))
    raw = F.trim(line.substr(start, F.length(line) - start))
    json_bytes = F.when(F.try_parse_json(F.concat(F.lit("["), raw, F.lit("]"))).isNotNull(), F.encode(raw, "UTF-8"))
    return (
        F.when(r["body_json"].isNotNull(), json_bytes)
        .when(r["body_text"].isNotNull(), F.encode(r["body_text"], "UTF-8"))
        .otherwise(F.try_to_binary(r["body_b64"], F.lit("base64")))
    )


def _system_properties(r: Column) -> Column:
    """v1: as written. v2: the column system properties put back where the record left them out, and those it
    wrote as null (a column the message had no such property for) removed."""
    sysprops = r["system_properties"]
    columns = [F.struct(F.lit(key).alias("k"), r[column].alias("v")) for key, column in COLUMN_SYSTEM_PROPERTIES]
    restore = F.map_from_entries(
        F.filter(
            F.array(*columns),
            lambda e: e["v"].isNotNull() & ~F.coalesce(F.map_contains_key(sysprops, e["k"]), F.lit(False)),
        )
    )
    empty = F.create_map().cast(T.MapType(T.StringType(), T.StringType()))
    v2 = F.map_filter(
        F.map_concat(F.coalesce(sysprops, empty), restore), lambda k, v: v.isNotNull() | ~k.isin(_TOMBSTONE_KEYS)
    )
    return F.when(r["v"] == 1, sysprops).otherwise(v2)


def classify(lines: DataFrame) -> DataFrame:
    """Lines (``value``, ``source_file``, ``ingest_at``) to typed rows with a ``reason`` (null when good)."""
    rec = F.from_json("value", _PARSE_SCHEMA, {"columnNameOfCorruptRecord": _CORRUPT, "mode": "PERMISSIVE"})
    parsed = lines.select("value", "source_file", "ingest_at", rec.alias("r"))
    r = F.col("r")
    corrupt = r[_CORRUPT].isNotNull()
    missing = _missing_fields(r)
    enqueued_ts = F.try_to_timestamp(r["enqueued_at"], F.lit(_ENQUEUED_AT_FORMAT))
    v1 = r["v"] == 1
    body_count = sum((F.when(r[name].isNotNull(), 1).otherwise(0) for name in BODY_FIELDS), F.lit(0))
    body = F.when(v1, F.try_to_binary(r["body"], F.lit("base64"))).otherwise(_v2_body(F.col("value"), r))
    # The second JSON parse (is it JSON at all, and an object?) only runs for the rare corrupt lines: CASE WHEN
    # and AND evaluate lazily, and the expression occurs once so it is not hoisted.
    is_object = F.coalesce(F.schema_of_variant(F.try_parse_json("value")), F.lit("")).startswith("OBJECT")
    reason = (
        F.when(F.trim("value") == "", F.lit("empty_line"))
        .when(corrupt & ~is_object, F.lit("unparseable_line"))
        .when(~corrupt & (r["v"].isNull() | ~r["v"].isin(list(READ_VERSIONS))), F.lit("unsupported_version"))
        .when(r[_CORRUPT].isNotNull(), F.lit("malformed_record"))
        .when(missing != "", F.concat(F.lit("missing_fields:"), missing))
        .when(enqueued_ts.isNull(), F.lit("bad_enqueued_at"))
        .when(~v1 & (body_count == 0), F.lit("no_body_field"))
        .when(~v1 & (body_count > 1), F.lit("several_body_fields"))
        .when(~v1 & r["body_json"].isNotNull() & body.isNull(), F.lit("body_json_not_last"))
        .when(body.isNull(), F.lit("body_not_base64"))
    )
    return parsed.select(
        "value",
        "source_file",
        "ingest_at",
        reason.alias("reason"),
        r["v"].alias("v"),
        r["edge_message_id"].alias("edge_message_id"),
        r["message_id"].alias("message_id"),
        r["device_id"].alias("device_id"),
        r["module_id"].alias("module_id"),
        r["hub_id"].alias("hub_id"),
        enqueued_ts.alias("enqueued_at"),
        r["priority"].alias("priority"),
        r["ttl_s"].alias("ttl_s"),
        r["source"].alias("source"),
        r["properties"].alias("properties"),
        _system_properties(r).alias("system_properties"),
        body.alias("body"),
    )


def _read_landing(spark: SparkSession, settings: JobSettings) -> DataFrame:
    reader = spark.readStream.format("text").option("pathGlobFilter", f"*{SEGMENT_SUFFIX}")
    # A broken gzip file must not fail the batch (and every replay of it): see _unreadable_files.
    reader = reader.option("recursiveFileLookup", "true").option("ignoreCorruptFiles", "true")
    if settings.max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", str(settings.max_files_per_trigger))
    raw = reader.load(settings.landing)
    # current_timestamp() is the micro-batch's time, fixed in the offset log: a replayed batch gets the same.
    return raw.select(
        "value", F.col("_metadata.file_path").alias("source_file"), F.current_timestamp().alias("ingest_at")
    )


def _deduplicated(classified: DataFrame, dedup_window: str) -> DataFrame:
    # Good rows are keyed by (hub_id, edge_message_id): the id is unique per hub only. Bad rows are keyed by where
    # they came from, so they never merge with a good row (two byte-identical bad lines in one file are one row).
    good_key = F.concat(F.lit("m:"), F.col("hub_id"), F.lit(":"), F.col("edge_message_id"))
    key = F.when(F.col("reason").isNull(), good_key).otherwise(
        F.concat(F.lit("q:"), F.col("source_file"), F.lit(":"), F.sha2(F.col("value"), 256))
    )
    return (
        classified.withColumn("dedup_key", key)
        .withWatermark("ingest_at", dedup_window)
        .dropDuplicatesWithinWatermark(["dedup_key"])
    )


# --- the idempotent sink ------------------------------------------------------------------------------------


class _HadoopDir:
    """Hadoop FileSystem operations under one folder: the lake or the checkpoint (local, HDFS, s3a, abfs: whatever
    the session can reach). Python never opens these paths itself, so a remote lake works like a local one."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm
        self._root_path = jvm.org.apache.hadoop.fs.Path(root)
        self._fs = self._root_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        self.root = self._root_path.toString()

    def path(self, *parts: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self.root + "/" + "/".join(parts))

    def exists(self, *parts: str) -> bool:
        return bool(self._fs.exists(self.path(*parts)))

    def delete(self, *parts: str) -> None:
        self._fs.delete(self.path(*parts), True)

    def touch(self, *parts: str, text: str = "") -> None:
        out = self._fs.create(self.path(*parts), True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()

    def read_text(self, *parts: str) -> str | None:
        """The whole file as UTF-8, or None when it does not exist."""
        p = self.path(*parts)
        if not self._fs.exists(p):
            return None
        stream = self._fs.open(p)
        try:
            return bytes(stream.readAllBytes()).decode("utf-8")
        finally:
            stream.close()

    def delete_path(self, p: Any) -> None:
        self._fs.delete(p, False)

    def glob(self, pattern: str) -> list[Any]:
        found = self._fs.globStatus(self.path(pattern))
        return [] if found is None else [s.getPath() for s in found]

    def mkdirs(self, p: Any) -> None:
        self._fs.mkdirs(p)

    def rename(self, src: Any, dst: Any) -> None:
        if not self._fs.rename(src, dst):
            raise OSError(f"rename {src.toString()} -> {dst.toString()} failed")


def _batch_tag(batch_id: int) -> str:
    return f"b{batch_id:010d}"


@dataclass(slots=True)
class _BatchCounts:
    bronze: int = 0
    quarantined: int = 0  # lines, and files that could not be read
    unreadable_files: int = 0
    skipped_replay: bool = False


@dataclass(slots=True)
class RunState:
    settings: JobSettings
    lake: _HadoopDir
    checkpoint: _HadoopDir
    counts: dict[int, _BatchCounts] = field(default_factory=dict)
    emitted: set[int] = field(default_factory=set)
    lock: threading.Condition = field(default_factory=threading.Condition)
    metrics_file: str | None = None
    listener: StreamingQueryListener | None = None
    query_id: str | None = None  # from the checkpoint's metadata; goes into every commit marker

    def wait_for_batches(self, n: int, *, timeout_s: float) -> bool:
        """Block until ``n`` batches were handled by this run (committed or skipped); False on timeout."""
        with self.lock:
            return self.lock.wait_for(lambda: len(self.counts) >= n, timeout=timeout_s)

    def wait_for_progress(self, n: int, *, timeout_s: float) -> bool:
        """Block until ``n`` batches of this run reported progress, which Spark does once a batch is in the
        checkpoint's commit log; False on timeout."""
        with self.lock:
            return self.lock.wait_for(lambda: len(self.emitted) >= n, timeout=timeout_s)


# --- landing files the text reader could not read ------------------------------------------------------------
#
# The source reads with ``ignoreCorruptFiles``: a segment whose gzip stream is broken (a truncated upload, flipped
# bytes, not gzip at all) gives the lines before the break and is then skipped. Without it the batch fails, and so
# does every restart, since the replay reads the same file. So that nothing is skipped silently, each batch checks
# the gzip stream (deflate data, CRC and length) of every file it read and quarantines each broken one as
# ``unreadable_file``. Which files a batch read is in the checkpoint: the offsets log gives the file source's log
# offset at the end of each batch, and the source's log (``sources/0``, format v1: one JSON entry per file, compacted
# every few batches into ``{id}.compact``) gives the files of each offset. Both are a function of the batch, so a
# replayed batch quarantines the same files.


def _offsets_entry(checkpoint: _HadoopDir, batch_id: int) -> tuple[dict[str, Any], int | None] | None:
    """The batch's metadata and the file source's log offset, from ``offsets/{batch}``; None when absent."""
    text = checkpoint.read_text("offsets", str(batch_id))
    if text is None:
        return None
    lines = text.splitlines()  # "v1", the batch metadata, then one offset per source (ours has one source)
    meta: dict[str, Any] = json.loads(lines[1])
    offset = None
    if len(lines) > 2 and lines[2].strip() not in ("", "-"):
        offset = int(json.loads(lines[2])["logOffset"])
    return meta, offset


def _source_log_files(checkpoint: _HadoopDir, log_id: int) -> list[str] | None:
    text = checkpoint.read_text("sources", "0", str(log_id))
    if text is None:
        compacted = sorted(int(p.getName().removesuffix(".compact")) for p in checkpoint.glob("sources/0/*.compact"))
        covering = [k for k in compacted if k >= log_id]
        if not covering:
            return None
        text = checkpoint.read_text("sources", "0", f"{covering[0]}.compact")
        if text is None:
            return None
    files = []
    for line in text.splitlines()[1:]:
        if line.strip():
            entry = json.loads(line)
            if int(entry["batchId"]) == log_id:
                files.append(str(entry["path"]))
    return files


def _batch_files(checkpoint: _HadoopDir, batch_id: int) -> list[str]:
    """The landing files query batch ``batch_id`` read."""
    this = _offsets_entry(checkpoint, batch_id)
    if this is None or this[1] is None:
        return []
    end = this[1]
    # The batch read the source's log entries after the previous batch's offset, up to its own. Spark keeps the
    # previous batch's offsets to recover; should they be gone, only the batch's own entry is checked.
    before = _offsets_entry(checkpoint, batch_id - 1) if batch_id > 0 else (None, None)
    first = end if before is None else 0 if before[1] is None else before[1] + 1
    files: list[str] = []
    for log_id in range(first, end + 1):
        found = _source_log_files(checkpoint, log_id)
        if found is None:
            _log.warning("ingest.source_log_missing batch=%d log_id=%d; files not checked", batch_id, log_id)
            continue
        files.extend(found)
    return files


def _gzip_error(spark: SparkSession, path: str) -> str | None:
    """None when ``path`` is a whole gzip stream; else what is wrong with it. Runs in the driver's JVM."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    p = jvm.org.apache.hadoop.fs.Path(path)
    try:
        stream = p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).open(p)
        try:
            # GZIPInputStream checks each member's CRC-32 and length, and raises on a stream that ends early.
            jvm.java.util.zip.GZIPInputStream(stream, 1 << 16).transferTo(jvm.java.io.OutputStream.nullOutputStream())
        finally:
            stream.close()
    except Py4JJavaError as exc:
        return str(exc.java_exception.toString())
    return None


def _unreadable_files(spark: SparkSession, run: RunState, batch_id: int) -> tuple[DataFrame | None, int]:
    """One quarantine row per file of the batch that is not a whole gzip stream (None when there is none), and
    how many."""
    broken = []
    for path in _batch_files(run.checkpoint, batch_id):
        error = _gzip_error(spark, path)
        if error is not None:
            _log.warning("ingest.unreadable_file batch=%d file=%s error=%s", batch_id, path, error)
            broken.append(path)
    if not broken:
        return None, 0
    entry = _offsets_entry(run.checkpoint, batch_id)
    assert entry is not None
    ingest_at = datetime.fromtimestamp(int(entry[0]["batchTimestampMs"]) / 1000, UTC)
    rows = [("unreadable_file", path, None, None, ingest_at) for path in broken]
    schema = "reason string, source_file string, line string, edge_message_id string, ingest_at timestamp"
    return spark.createDataFrame(rows, schema), len(broken)


def _silver(bronze: DataFrame) -> DataFrame:
    return bronze.select(
        "edge_message_id",
        "hub_id",
        "device_id",
        "module_id",
        "priority",
        "enqueued_at",
        "ingest_at",
        "properties",
        F.try_parse_json(F.col("body").cast("string")).alias("body"),
    )


def _device_minute_partials(silver: DataFrame, batch_id: int) -> DataFrame:
    # Only a JSON object has top-level fields. A body that is JSON but not an object ([1,2], 42, "x") is legal;
    # a plain cast would fail the whole batch on it (INVALID_VARIANT_CAST under ANSI mode), and the replay after
    # a restart would fail the same way for ever. The filter says what is meant; try_cast keeps it safe however
    # the optimizer orders the two.
    fields = silver.where(F.schema_of_variant("body").startswith("OBJECT")).select(
        "device_id",
        F.date_trunc("minute", "enqueued_at").alias("minute"),
        F.explode(F.expr("try_cast(body as map<string,variant>)")).alias("field", "value"),
    )
    numeric = fields.where(F.schema_of_variant("value").rlike(_NUMERIC_VARIANT)).select(
        "device_id", "minute", "field", F.variant_get("value", "$", "double").alias("x")
    )
    per_field = numeric.groupBy("device_id", "minute", "field").agg(
        F.count("x").alias("n"), F.sum("x").alias("sum"), F.min("x").alias("min"), F.max("x").alias("max")
    )
    messages = (
        silver.select("device_id", F.date_trunc("minute", "enqueued_at").alias("minute"))
        .groupBy("device_id", "minute")
        .agg(F.count(F.lit(1)).alias("n"))
        .select(
            "device_id",
            "minute",
            F.lit(None).cast("string").alias("field"),  # the row counting messages, fields or not
            "n",
            F.lit(None).cast("double").alias("sum"),
            F.lit(None).cast("double").alias("min"),
            F.lit(None).cast("double").alias("max"),
        )
    )
    return per_field.unionByName(messages).withColumn("batch_id", F.lit(batch_id).cast("long"))


def device_minute_stats(spark: SparkSession, lake: str) -> DataFrame:
    """The example aggregate: per device and minute, the message count and min/max/avg of each numeric field."""
    partials = spark.read.parquet(f"{lake}/device_minute")
    msgs = partials.where(F.col("field").isNull()).groupBy("device_id", "minute").agg(F.sum("n").alias("count"))
    stats = (
        partials.where(F.col("field").isNotNull())
        .groupBy("device_id", "minute", "field")
        .agg(
            F.min("min").alias("min"),
            F.max("max").alias("max"),
            (F.sum("sum") / F.sum("n")).alias("avg"),
            F.sum("n").alias("n"),
        )
    )
    return msgs.join(stats, ["device_id", "minute"], "left").orderBy("device_id", "minute", "field")


def _batch_ingest_date(checkpoint: _HadoopDir, batch_id: int) -> str:
    """The UTC date of the batch's time (``current_timestamp()`` in the batch, fixed in the offsets log)."""
    entry = _offsets_entry(checkpoint, batch_id)
    assert entry is not None, f"batch {batch_id} has no offsets entry"
    return datetime.fromtimestamp(int(entry[0]["batchTimestampMs"]) / 1000, UTC).date().isoformat()


def _write_batch(run: RunState, batch: DataFrame, batch_id: int) -> None:
    lake, settings = run.lake, run.settings
    tag = _batch_tag(batch_id)
    if lake.exists("_committed", tag):
        _log.info("ingest.batch_replay_skipped batch=%d", batch_id)
        # The rows are already in the tables, but the dedup state of this batch must still be committed, and
        # Spark checks that every state partition was: run the plan into the no-op sink.
        batch.write.format("noop").mode("overwrite").save()
        with run.lock:
            run.counts[batch_id] = _BatchCounts(skipped_replay=True)
            run.lock.notify_all()
        return
    # A half-done earlier attempt may have moved some files in: take them out before writing again.
    for table in _TABLES:
        for leftover in lake.glob(f"{table}/*/part-{tag}-*"):
            lake.delete_path(leftover)
    lake.delete("_staging", tag)

    # A batch has one ingest time, so one ingest_date: the tables are written unpartitioned to staging and the
    # files moved into {table}/ingest_date={day}/ (partitionBy would sort every row by a constant).
    day = _batch_ingest_date(run.checkpoint, batch_id)
    staging = lake.path("_staging", tag).toString()
    # The batch is computed once (classification, dedup state) and kept for the writes below; the raw line is
    # kept for bad rows only, which is all the quarantine needs.
    rows = batch.select(
        *BRONZE_COLUMNS[:-1],  # ingest_date is the folder
        "reason",
        F.when(F.col("reason").isNotNull(), F.col("value")).alias("line"),
    ).persist()
    try:
        tally = rows.agg(
            F.count(F.when(F.col("reason").isNull(), 1)).alias("good"),
            F.count(F.when(F.col("reason").isNotNull(), 1)).alias("bad"),
        ).first()
        assert tally is not None
        good = rows.where(F.col("reason").isNull()).select(*BRONZE_COLUMNS[:-1])
        bad = rows.where(F.col("reason").isNotNull()).select(
            "reason", "source_file", "line", "edge_message_id", "ingest_at"
        )
        unreadable, n_unreadable = _unreadable_files(batch.sparkSession, run, batch_id)
        if unreadable is not None:
            bad = bad.unionByName(unreadable)
        counts = _BatchCounts(
            bronze=int(tally["good"]), quarantined=int(tally["bad"]) + n_unreadable, unreadable_files=n_unreadable
        )

        def stage(table: str, frame: DataFrame) -> None:
            frame.write.mode("overwrite").option("maxRecordsPerFile", settings.max_records_per_file).parquet(
                f"{staging}/{table}"
            )

        if counts.quarantined:
            stage("quarantine", bad)
        if counts.bronze:
            stage("bronze", good)
            stage("silver", _silver(good))
            # From the staged silver: the bodies are parsed once, not again for the aggregate.
            staged_silver = batch.sparkSession.read.parquet(f"{staging}/silver")
            stage("device_minute", _device_minute_partials(staged_silver, batch_id))
        for table in _TABLES:
            staged = lake.glob(f"_staging/{tag}/{table}/part-*")
            if staged:
                lake.mkdirs(lake.path(table, f"ingest_date={day}"))
            for i, src in enumerate(sorted(staged, key=lambda p: p.toString())):
                suffix = src.getName().split(".", 1)[1] if "." in src.getName() else "parquet"
                lake.rename(src, lake.path(table, f"ingest_date={day}", f"part-{tag}-{i:05d}.{suffix}"))
        if run.query_id is None:
            run.query_id = _checkpoint_query_id(run.checkpoint)
        marker = {"bronze": counts.bronze, "quarantined": counts.quarantined, "query_id": run.query_id}
        lake.touch("_committed", tag, text=json.dumps(marker))
        lake.delete("_staging", tag)
    finally:
        rows.unpersist()
    with run.lock:
        run.counts[batch_id] = counts
        run.lock.notify_all()


def _emit_metrics(run: RunState, progress: dict[str, Any]) -> None:
    batch_id = int(progress["batchId"])
    with run.lock:
        if batch_id in run.emitted or batch_id not in run.counts:
            return
        run.emitted.add(batch_id)
        run.lock.notify_all()
        counts = run.counts[batch_id]
    input_rows = int(progress.get("numInputRows", 0))
    # Every input row ends in bronze or quarantine unless the dedup step removed it. An unreadable file is one
    # quarantine row that is no input row.
    lines_quarantined = counts.quarantined - counts.unreadable_files
    dropped = 0 if counts.skipped_replay else input_rows - counts.bronze - lines_quarantined
    line = {
        "batch_id": batch_id,
        "at": progress.get("timestamp"),
        "input_rows": input_rows,
        "bronze_rows": counts.bronze,
        "duplicates": dropped,
        "quarantined": counts.quarantined,
        "unreadable_files": counts.unreadable_files,
        "replay_skipped": counts.skipped_replay,
    }
    text = json.dumps(line, separators=(",", ":"))
    # One file per emission, through the lake's Hadoop FS: object stores cannot append, and a replayed batch
    # reports again under its own name (batch id first, so the names sort by batch, then time).
    stamp = "".join(ch for ch in str(progress.get("timestamp") or datetime.now(UTC).isoformat()) if ch.isalnum())
    try:
        run.lake.touch("_metrics", f"b{batch_id:010d}-{stamp}.jsonl", text=text + "\n")
    except Py4JJavaError as exc:
        _log.warning("ingest.metrics_write_failed batch=%d error=%s", batch_id, exc.java_exception.toString())
    if run.metrics_file is not None:
        with open(run.metrics_file, "a", encoding="utf-8") as out:
            out.write(text + "\n")
    if run.settings.print_metrics:
        print(f"ingest.batch {text}", flush=True)


class _MetricsListener(StreamingQueryListener):
    def __init__(self, run: RunState, query_id: list[str]) -> None:
        self._run = run
        self._query_id = query_id

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = json.loads(event.progress.json)
        if self._query_id and progress.get("id") == self._query_id[0]:
            _emit_metrics(self._run, progress)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def _local_metrics_file(settings: JobSettings) -> str | None:
    if settings.metrics_path is None:
        return None
    os.makedirs(os.path.dirname(settings.metrics_path) or ".", exist_ok=True)
    return settings.metrics_path


def _checkpoint_query_id(checkpoint: _HadoopDir) -> str | None:
    """The id of the query a checkpoint belongs to (``metadata``, written when the query first starts)."""
    text = checkpoint.read_text("metadata")
    return None if text is None else str(json.loads(text)["id"])


def _refuse_a_checkpoint_that_did_not_write_the_lake(lake: _HadoopDir, checkpoint: _HadoopDir) -> None:
    markers = sorted(lake.glob("_committed/b*"), key=lambda p: p.getName())
    if not markers:
        return
    if not checkpoint.glob("offsets/[0-9]*"):
        raise CheckpointMismatchError(
            f"lake {lake.root} holds {len(markers)} committed batches but checkpoint {checkpoint.root} is new: "
            "its batch ids would collide with the lake's commit markers and new data would be skipped. Run with "
            "the checkpoint that wrote this lake, or write to a new lake.",
            lake=lake.root,
            checkpoint=checkpoint.root,
        )
    text = lake.read_text("_committed", markers[-1].getName())
    lake_query = json.loads(text).get("query_id") if text else None
    ours = _checkpoint_query_id(checkpoint)
    if lake_query is not None and lake_query != ours:
        raise CheckpointMismatchError(
            f"lake {lake.root} was written by query {lake_query}, but checkpoint {checkpoint.root} belongs to query "
            f"{ours}: their batch ids do not match. Run with the checkpoint that wrote this lake, or write to a new "
            "lake.",
            lake=lake.root,
            checkpoint=checkpoint.root,
        )


def start(spark: SparkSession, settings: JobSettings) -> tuple[StreamingQuery, RunState]:
    """Start the streaming query; the caller waits on it and must stop it.

    Raises ``CheckpointMismatchError`` when the lake holds batches committed by another checkpoint's query.
    """
    lake = _HadoopDir(spark, settings.lake)
    checkpoint = _HadoopDir(spark, settings.checkpoint)
    _refuse_a_checkpoint_that_did_not_write_the_lake(lake, checkpoint)
    run = RunState(settings=settings, lake=lake, checkpoint=checkpoint)
    run.metrics_file = _local_metrics_file(settings)
    stream = _deduplicated(classify(_read_landing(spark, settings)), settings.dedup_window)
    writer = stream.writeStream.option("checkpointLocation", settings.checkpoint).foreachBatch(
        lambda df, batch_id: _write_batch(run, df, batch_id)
    )
    if settings.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=settings.processing_interval)
    query_id: list[str] = []
    listener = _MetricsListener(run, query_id)
    spark.streams.addListener(listener)
    query = writer.start()
    query_id.append(str(query.id))
    run.listener = listener
    return query, run


def finish(spark: SparkSession, query: StreamingQuery, run: RunState) -> None:
    """Emit metrics the listener has not delivered yet, then drop the listener."""
    for progress in query.recentProgress:
        _emit_metrics(run, json.loads(progress.json))
    if run.listener is not None:
        spark.streams.removeListener(run.listener)
        run.listener = None


def run(spark: SparkSession, settings: JobSettings) -> None:
    """Run the job until the landing zone is drained (available-now) or until interrupted (continuous)."""
    query, state = start(spark, settings)
    try:
        query.awaitTermination()
    finally:
        query.stop()
        finish(spark, query, state)


# --- compaction ---------------------------------------------------------------------------------------------


def compact(spark: SparkSession, lake_root: str, *, before: str, max_records_per_file: int = 500_000) -> dict[str, int]:
    """Rewrite each table partition with ``ingest_date < before`` (ISO date) into as few files as the cap allows.

    Returns ``{table/partition: files_after}`` for the partitions it rewrote (those with more than one file).
    The swap is: write to ``_compact/...``, move the old files to ``_compact_trash``, move the new ones in.
    """
    lake = _HadoopDir(spark, lake_root)
    cutoff = before
    done: dict[str, int] = {}
    for table in _TABLES:
        for part in lake.glob(f"{table}/ingest_date=*"):
            day = part.getName().split("=", 1)[1]
            if day >= cutoff:
                continue
            files = [p for p in lake.glob(f"{table}/{part.getName()}/part-*")]
            if len(files) <= 1:
                continue
            frame = spark.read.parquet(*[f.toString() for f in files])
            rows = frame.count()
            n_files = max(1, -(-rows // max_records_per_file))
            staging = lake.path("_compact", table, part.getName())
            lake.delete("_compact", table, part.getName())
            frame.repartition(n_files).write.mode("overwrite").option(
                "maxRecordsPerFile", max_records_per_file
            ).parquet(staging.toString())
            trash = lake.path("_compact_trash", table, part.getName())
            lake.mkdirs(trash)
            for f in files:
                lake.rename(f, lake.path("_compact_trash", table, part.getName(), f.getName()))
            new_files = lake.glob(f"_compact/{table}/{part.getName()}/part-*")
            stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
            for i, src in enumerate(sorted(new_files, key=lambda p: p.toString())):
                suffix = src.getName().split(".", 1)[1]
                lake.rename(src, lake.path(table, part.getName(), f"part-c{stamp}-{i:05d}.{suffix}"))
            lake.delete("_compact_trash", table, part.getName())
            lake.delete("_compact", table, part.getName())
            done[f"{table}/{part.getName()}"] = len(new_files)
            _log.info(
                "ingest.compacted table=%s partition=%s files_before=%d files_after=%d",
                table,
                day,
                len(files),
                len(new_files),
            )
    return done


# --- command line -------------------------------------------------------------------------------------------


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    if argv and argv[0] == "compact":
        p = argparse.ArgumentParser(prog="python -m spark_upload.job compact", description=compact.__doc__)
        p.add_argument("--lake", required=True)
        p.add_argument("--older-than-days", type=int, default=2)
        p.add_argument("--max-records-per-file", type=int, default=500_000)
        p.add_argument("--master", default=None)
        ns = p.parse_args(list(argv[1:]))
        ns.command = "compact"
        return ns
    p = argparse.ArgumentParser(prog="python -m spark_upload.job", description=__doc__.split("\n\n")[0])
    p.add_argument("--landing", required=True, help="landing zone folder or URL (file://, s3a://, abfss://)")
    p.add_argument("--lake", required=True, help="where the tables go")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint location")
    p.add_argument("--trigger", choices=("available-now", "continuous"), default="available-now")
    p.add_argument("--master", default=None, help="e.g. local[2]; omitted under spark-submit")
    p.add_argument("--processing-interval", default="10 seconds")
    p.add_argument("--dedup-window", default="6 hours")
    p.add_argument("--max-records-per-file", type=int, default=500_000)
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


def _driver_cpu_s(spark: SparkSession) -> float:
    """User plus system CPU seconds so far of this Python process and of the driver's JVM (from /proc on Linux;
    the Python part only elsewhere)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state is fields[0]
    except OSError:
        return total
    return total + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if ns.command == "compact":
        spark = build_session(master=ns.master, app_name="edgehub-compact")
        try:
            before = (datetime.now(UTC) - timedelta(days=ns.older_than_days)).date().isoformat()
            done = compact(spark, ns.lake, before=before, max_records_per_file=ns.max_records_per_file)
            print(json.dumps({"compacted": done}))
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
    started, cpu_started = time.perf_counter(), _driver_cpu_s(spark)
    try:
        run(spark, settings)
        elapsed_s, cpu_s = time.perf_counter() - started, _driver_cpu_s(spark) - cpu_started
        # CPU seconds of this driver (its JVM, which holds the executors in local mode, and Python) during the
        # run: cpu_s / elapsed_s is how many cores the run kept busy.
        print(f"ingest.run_done elapsed_s={elapsed_s:.3f} cpu_s={cpu_s:.3f}", flush=True)
    except CheckpointMismatchError as exc:
        print(f"ingest.refused {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
