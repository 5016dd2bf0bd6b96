"""The lake's tables: their names and folder layout, the tables derived from bronze (silver, device_minute), and
the example aggregate over device_minute.

Layout: ``{lake}/{table}/ingest_date={day}/part-{tag}-{i:05d}.{suffix}``, Parquet, at most ``max_records_per_file``
rows a file. ``tag`` says who wrote the file: ``b{batch:010d}`` for the sink, ``c{time}`` for compaction. Names
starting with ``_`` or ``.`` inside the lake are bookkeeping (staging, commit markers, metrics); Spark's readers
skip them.

Invariants: a file enters a table only by a rename (``move_in``) into its partition, under a name carrying its
tag, so the sink can find and remove what a half-done attempt moved in; derived tables are computed from one
batch's bronze alone, so a replayed batch derives the same rows.
"""

from __future__ import annotations

import posixpath

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_upload.spark_internals import HadoopDir

__all__ = [
    "TABLES",
    "device_minute_partials",
    "device_minute_stats",
    "move_in",
    "partition",
    "silver",
    "write_capped",
]

TABLES = ("bronze", "quarantine", "silver", "device_minute")
# Columns that differ from row to row (a message's ids, its body, its millisecond time).
_UNIQUE_COLUMNS = frozenset({"edge_message_id", "message_id", "enqueued_at", "body"})


def partition(day: str) -> str:
    """The folder name of ``day``'s partition (ISO date, UTC)."""
    return f"ingest_date={day}"


def write_capped(frame: DataFrame, uri: str, *, max_records_per_file: int) -> None:
    """Write ``frame`` as Parquet files at ``uri`` (replacing what is there), at most ``max_records_per_file``
    rows a file."""
    writer = frame.write.mode("overwrite").option("maxRecordsPerFile", max_records_per_file)
    # A column whose values are all different gains nothing from a dictionary: Parquet builds one anyway, hashing
    # every value into it, until it passes its size limit and re-encodes what it holds plainly.
    for column in _UNIQUE_COLUMNS.intersection(frame.columns):
        writer = writer.option(f"parquet.enable.dictionary#{column}", "false")
    writer.parquet(uri)


def move_in(lake: HadoopDir, files: list[str], table: str, day: str, *, tag: str) -> int:
    """Move ``files`` (relative to the lake) into ``table``'s partition of ``day`` as ``part-{tag}-{i:05d}.{suffix}``,
    in name order; returns how many."""
    if files:
        lake.mkdirs(table, partition(day))
    for i, src in enumerate(sorted(files)):
        name = posixpath.basename(src)
        suffix = name.split(".", 1)[1] if "." in name else "parquet"
        lake.rename(src, f"{table}/{partition(day)}/part-{tag}-{i:05d}.{suffix}")
    return len(files)


def silver(bronze: DataFrame) -> DataFrame:
    """Bronze rows with the body parsed to a VARIANT (null when it is not JSON, which is legal: bodies are bytes)."""
    return bronze.select(
        "edge_message_id",
        "hub_id",
        "device_id",
        "module_id",
        "priority",
        "enqueued_at",
        "ingest_at",
        "properties",
        F.try_parse_json(F.col("body").cast(T.StringType())).alias("body"),
    )


def device_minute_partials(silver: DataFrame, batch_id: int) -> DataFrame:
    """One batch's partial aggregates: per device and minute, a row counting messages (``field`` null) and per
    numeric top-level body field its count, sum, min and max.

    One scan of ``silver`` and one aggregation: each message becomes its own counting entry (field null) plus one
    entry per top-level field, the entries of non-numeric fields are dropped, and the rest are grouped by (device,
    minute, field). The fields are filtered after the explode, by a plain WHERE, not by map_filter/transform on
    each row's map: higher-order functions are interpreted row by row (no code generation), and took most of this
    table's time.

    A field is numeric when its value's JSON text is a number, and its ``x`` is that text read as a double. This
    is the same as asking the value's variant type (an integer, decimal or double) and casting the variant, which
    tests/spark_upload/test_tables.py holds it to; but a variant cast of an integer or decimal to double builds a
    Cast expression for every value, which took half of this table's time.
    """
    # Only a JSON object has top-level fields. A body that is JSON but not an object ([1,2], 42, "x") is legal;
    # a plain cast would fail the whole batch on it (INVALID_VARIANT_CAST under ANSI mode), and the replay after
    # a restart would fail the same way for ever. try_cast gives null for it (and for a body that is not JSON):
    # no fields. Asking schema_of_variant whether the body is an object first cost more than the cast: it
    # describes the whole body, field by field, as a string.
    fields_type = T.MapType(T.StringType(), T.VariantType())
    fields = F.coalesce(F.col("body").try_cast(fields_type), F.create_map().cast(fields_type))
    counting = F.struct(F.lit(None).cast(T.StringType()).alias("key"), F.lit(None).cast(T.VariantType()).alias("value"))
    exploded = silver.select(
        "device_id",
        F.date_trunc("minute", "enqueued_at").alias("minute"),
        F.explode(F.concat(F.array(counting), F.map_entries(fields))).alias("e"),
    )
    entries = exploded.select(
        "device_id", "minute", F.col("e.key").alias("field"), F.to_json(F.col("e.value")).alias("text")
    ).where(F.col("field").isNull() | _is_json_number(F.col("text")))
    return (
        entries.select("device_id", "minute", "field", F.col("text").try_cast(T.DoubleType()).alias("x"))
        .groupBy("device_id", "minute", "field")
        .agg(
            # the counting entry's x is null: its n counts messages, and its sum, min and max stay null
            F.when(F.col("field").isNull(), F.count(F.lit(1))).otherwise(F.count("x")).alias("n"),
            F.sum("x").alias("sum"),
            F.min("x").alias("min"),
            F.max("x").alias("max"),
        )
        .withColumn("batch_id", F.lit(batch_id).cast(T.LongType()))
    )


def _is_json_number(text: Column) -> Column:
    """Whether ``text``, the JSON text of a value, is a number: JSON's numbers alone start with a digit or a minus."""
    first = F.substring(text, 1, 1)
    return ((first >= F.lit("0")) & (first <= F.lit("9"))) | (first == F.lit("-"))


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
