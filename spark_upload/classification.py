"""Classification: landing-zone lines to typed rows, each good (bronze) or bad with its reason (quarantine).

The reasons, and what bronze holds, are listed in ``spark_upload.job``'s docstring. Everything here is a Spark
column expression (no Python UDF), so executors need none of our code.

Invariants:

* Every line gets exactly one outcome: a null ``reason`` (bronze) or the first reason that applies, in the order
  of ``classify``'s ``CASE WHEN``. Nothing is dropped here; a line that is not JSON is a row too.
* ``RECORD_SCHEMA`` is the segment format's line, field for field (``edgehub.upstream.segment.LINE_FIELDS``: the
  v1 fields, then the v2 body fields; a test keeps them in step), and ``BRONZE_COLUMNS`` starts with
  ``RECORD_FIELDS``.
* A row's ``ingest_at`` is the micro-batch's time, fixed in the checkpoint: a replayed batch classifies and
  deduplicates to the same rows.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from edgehub.upstream.segment import (
    BODY_FIELDS,
    COLUMN_SYSTEM_PROPERTIES,
    READ_VERSIONS,
    RECORD_FIELDS,
    SEGMENT_SUFFIX,
)
from spark_upload.decoding import UNDECODABLE_KEY

__all__ = [
    "BRONZE_COLUMNS",
    "RECORD_SCHEMA",
    "REQUIRED_FIELDS",
    "classify",
    "deduplicated",
    "enqueued_at",
    "read_landing",
    "system_properties",
]

# A segment line of any version we read, field for field. body_json may hold any JSON value: a string column gets
# its text.
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
# What follows the first body_json key up to the line's last character, when that is at least one character: the
# fast path of ``_body_json_text``. (?s): any character, line breaks too; \z: the very end, not before a line break.
_BODY_JSON_CUT = "(?s)" + _BODY_JSON_KEY + r"(.+).\z"
_TOMBSTONE_KEYS = [key for key, _ in COLUMN_SYSTEM_PROPERTIES]
_CORRUPT = "_corrupt_record"
_PARSE_SCHEMA = T.StructType([*RECORD_SCHEMA.fields, T.StructField(_CORRUPT, T.StringType())])
_ENQUEUED_AT_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSX"
# The form the hub writes (edgehub.upstream.segment), which the pattern above accepts: see ``enqueued_at``.
_ENQUEUED_AT_SHAPE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{3}Z$"

# Bronze keeps every segment field, then where and when it was ingested.
BRONZE_COLUMNS: tuple[str, ...] = (*RECORD_FIELDS, "source_file", "ingest_at", "ingest_date")


def _missing_fields(rec: Column) -> Column:
    names = [F.when(rec[name].isNull(), F.lit(name)) for name in REQUIRED_FIELDS]
    names.append(F.when((rec["v"] == 1) & rec["body"].isNull(), F.lit("body")))
    return F.concat_ws(",", *names)


def _any_missing(rec: Column) -> Column:
    """Whether ``_missing_fields`` names any: the test every row takes, without building the list."""
    missing = (rec["v"] == 1) & rec["body"].isNull()
    for name in REQUIRED_FIELDS:
        missing = missing | rec[name].isNull()
    return missing


def enqueued_at(text: Column) -> Column:
    """``enqueued_at``'s text as a timestamp, null unless it has the strict form ``_ENQUEUED_AT_FORMAT``.

    Text of the exact shape the hub writes (edgehub.upstream.segment: milliseconds and ``Z``) goes through Spark's
    own string-to-timestamp cast; anything else through the pattern. On that shape both parse the same or both
    refuse (tests/spark_upload/test_classification.py holds them together), and the cast costs a fraction of the
    pattern's formatter, which took 7 % of the job's task time."""
    strict = F.try_to_timestamp(text, F.lit(_ENQUEUED_AT_FORMAT))
    return F.when(text.rlike(_ENQUEUED_AT_SHAPE), text.try_cast(T.TimestampType())).otherwise(strict)


def _body_json_cut(value: Column) -> Column:
    """The fast path of ``_body_json_text``: what a regular expression cuts from the line (empty when it has no
    ``"body_json":`` with two characters after it). Computed in a projection of its own: ``_body_json_text`` reads it
    twice, and Spark would evaluate the expression at each."""
    return F.regexp_extract(F.rtrim(value), _BODY_JSON_CUT, 1)


def _body_json_text(value: Column, cut: Column) -> Column:
    """body_json's text in a v2 line: after the line's first ``"body_json":`` up to its last character (the record's
    closing brace), spaces around it aside (edgehub.upstream.segment's docstring). ``cut`` is
    ``_body_json_cut(value)``.

    Two paths, one result (tests/spark_upload/test_classification.py holds them together): ``cut`` when it is not
    empty, else ``locate`` and ``substr``, the rule as stated. The expression finds the key by a Boyer-Moore
    search; Spark's ``locate`` compares the key at every character of the line, and ``substr`` and ``length``
    count the characters again. With the key near the end of a 400-byte line, that took a quarter of classifying
    lines with JSON bodies."""
    line = F.rtrim(value)
    start = F.locate(_BODY_JSON_KEY, line) + F.lit(len(_BODY_JSON_KEY))
    general = line.substr(start, F.length(line) - start)
    return F.trim(F.when(cut != F.lit(""), cut).otherwise(general))


def _v2_body(value: Column, r: Column, cut: Column) -> Column:
    """A v2 record's body bytes, null when its one body field does not decode. body_json is its text in the line
    (``_body_json_text``; ``cut`` is ``_body_json_cut(value)``); wrapped in brackets it parses only when that text is
    the value (the record's last field): parse_json ignores text after a value, but not a stray brace or
    ``,"key":`` inside an array."""
    raw = _body_json_text(value, cut)
    json_bytes = F.when(F.try_parse_json(F.concat(F.lit("["), raw, F.lit("]"))).isNotNull(), F.encode(raw, "UTF-8"))
    return (
        F.when(r["body_json"].isNotNull(), json_bytes)
        .when(r["body_text"].isNotNull(), F.encode(r["body_text"], "UTF-8"))
        .otherwise(F.try_to_binary(r["body_b64"], F.lit("base64")))
    )


def system_properties(r: Column) -> Column:
    """v1: as written. v2: the column system properties put back where the record left them out, and those it
    wrote as null (a column the message had no such property for) removed.

    Two paths, one result (tests/spark_upload/test_classification.py holds them together): a record whose system
    properties are all column ones (what the hub writes unless a device set others) takes ``_restored``, built
    from plain expressions; any other takes ``_system_properties_general``, whose higher-order functions Spark
    interprets row by row (9 % of the job's task time when every row took it). Those functions also keep
    ``classify``'s last projection out of whole-stage code generation, which is wanted: compiled whole-stage, its
    method passes HotSpot's 8000-byte limit for compiling and runs in the interpreter (classifying took 60 % longer)."""
    sysprops = r["system_properties"]
    present = [F.coalesce(F.map_contains_key(sysprops, key), F.lit(False)) for key in _TOMBSTONE_KEYS]
    only_column_keys = F.coalesce(F.size(sysprops), F.lit(0)) == sum(
        (F.when(p, 1).otherwise(0) for p in present), F.lit(0)
    )
    v2 = F.when(only_column_keys, _restored(r, present)).otherwise(_system_properties_general(r))
    return F.when(r["v"] == 1, sysprops).otherwise(v2)


def _restored(r: Column, present: list[Column]) -> Column:
    """The column system properties of a v2 record whose ``system_properties`` holds column keys only: each is the
    value written there (null: removed), else its column's (null: absent)."""
    entries = []
    for is_written, (key, column) in zip(present, COLUMN_SYSTEM_PROPERTIES, strict=True):
        value = F.when(is_written, r["system_properties"][key]).otherwise(r[column])
        entries.append(F.when(value.isNotNull(), F.struct(F.lit(key).alias("key"), value.alias("value"))))
    entry = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.StringType())])
    no_entry = F.array(F.lit(None).cast(entry))
    return F.map_from_entries(F.array_except(F.array(*entries), no_entry))


def _system_properties_general(r: Column) -> Column:
    """``system_properties`` of any v2 record (the rule ``system_properties`` states)."""
    sysprops = r["system_properties"]
    columns = [F.struct(F.lit(key).alias("k"), r[column].alias("v")) for key, column in COLUMN_SYSTEM_PROPERTIES]
    restore = F.map_from_entries(
        F.filter(
            F.array(*columns),
            lambda e: e["v"].isNotNull() & ~F.coalesce(F.map_contains_key(sysprops, e["k"]), F.lit(False)),
        )
    )
    empty = F.create_map().cast(T.MapType(T.StringType(), T.StringType()))
    return F.map_filter(
        F.map_concat(F.coalesce(sysprops, empty), restore), lambda k, v: v.isNotNull() | ~k.isin(_TOMBSTONE_KEYS)
    )


def classify(lines: DataFrame) -> DataFrame:
    """Lines (``value``, ``source_file``, ``ingest_at``) to typed rows with a ``reason`` (null when good) and the
    raw ``line``, kept for bad rows only (all the quarantine needs): a good row's line would be carried through the
    dedup shuffle for nothing.

    Four projections, each value computed once: the parse; body_json's cut (``_body_json_cut``, for the lines that
    have one); the decoded body and timestamp (each tested by several reasons and kept); the reason (tested by
    ``line`` and kept). Folded into one, Spark evaluated the body and the timestamp once per reason that tests
    them."""
    rec = F.from_json("value", _PARSE_SCHEMA, {"columnNameOfCorruptRecord": _CORRUPT, "mode": "PERMISSIVE"})
    parsed = lines.select("value", "source_file", "ingest_at", rec.alias("r"))
    r = F.col("r")
    v1 = r["v"] == 1
    cut = parsed.select("*", F.when(~v1 & r["body_json"].isNotNull(), _body_json_cut(F.col("value"))).alias("cut"))
    v2_body = _v2_body(F.col("value"), r, F.col("cut"))
    decoded = cut.select(
        "value",
        "source_file",
        "ingest_at",
        "r",
        enqueued_at(r["enqueued_at"]).alias("enqueued_ts"),
        F.when(v1, F.try_to_binary(r["body"], F.lit("base64"))).otherwise(v2_body).alias("body"),
    )
    corrupt = r[_CORRUPT].isNotNull()
    body_count = sum((F.when(r[name].isNotNull(), 1).otherwise(0) for name in BODY_FIELDS), F.lit(0))
    body = F.col("body")
    # The second JSON parse (is it JSON at all, and an object?) only runs for the rare corrupt lines: CASE WHEN
    # and AND evaluate lazily, and the expression occurs once so it is not hoisted. A blank line parses to a null
    # record, so only such a record's line is trimmed.
    is_object = F.coalesce(F.schema_of_variant(F.try_parse_json("value")), F.lit("")).startswith("OBJECT")
    reason = (
        F.when(r.isNull() & (F.trim("value") == ""), F.lit("empty_line"))
        .when(corrupt & ~is_object, F.lit("unparseable_line"))
        # A decoded copy's one line for a zstd segment that could not be decoded (spark_upload.decoding); looked
        # for only in lines without a version, so a record's line never pays for it.
        .when(
            ~corrupt & r["v"].isNull() & F.get_json_object("value", f"$.{UNDECODABLE_KEY}").isNotNull(),
            F.lit(UNDECODABLE_KEY),
        )
        .when(~corrupt & (r["v"].isNull() | ~r["v"].isin(list(READ_VERSIONS))), F.lit("unsupported_version"))
        .when(r[_CORRUPT].isNotNull(), F.lit("malformed_record"))
        .when(_any_missing(r), F.concat(F.lit("missing_fields:"), _missing_fields(r)))
        .when(F.col("enqueued_ts").isNull(), F.lit("bad_enqueued_at"))
        .when(~v1 & (body_count == 0), F.lit("no_body_field"))
        .when(~v1 & (body_count > 1), F.lit("several_body_fields"))
        .when(~v1 & r["body_json"].isNotNull() & body.isNull(), F.lit("body_json_not_last"))
        .when(body.isNull(), F.lit("body_not_base64"))
    )
    reasoned = decoded.select("*", reason.alias("reason"))
    return reasoned.select(
        F.when(F.col("reason").isNotNull(), F.col("value")).alias("line"),
        "source_file",
        "ingest_at",
        "reason",
        r["v"].alias("v"),
        r["edge_message_id"].alias("edge_message_id"),
        r["message_id"].alias("message_id"),
        r["device_id"].alias("device_id"),
        r["module_id"].alias("module_id"),
        r["hub_id"].alias("hub_id"),
        F.col("enqueued_ts").alias("enqueued_at"),
        r["priority"].alias("priority"),
        r["ttl_s"].alias("ttl_s"),
        r["source"].alias("source"),
        r["properties"].alias("properties"),
        system_properties(r).alias("system_properties"),
        "body",
    )


def read_landing(spark: SparkSession, landing: str, *, max_files_per_trigger: int | None) -> DataFrame:
    """The landing zone's segment lines as a stream of ``value``, ``source_file``, ``ingest_at``."""
    reader = spark.readStream.format("text").option("pathGlobFilter", f"*{SEGMENT_SUFFIX}")
    # A broken gzip file must not fail the batch (and every replay of it): the sink quarantines each such file as
    # unreadable_file.
    reader = reader.option("recursiveFileLookup", "true").option("ignoreCorruptFiles", "true")
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    raw = reader.load(landing)
    # current_timestamp() is the micro-batch's time, fixed in the offset log: a replayed batch gets the same.
    return raw.select(
        "value", F.col("_metadata.file_path").alias("source_file"), F.current_timestamp().alias("ingest_at")
    )


def deduplicated(classified: DataFrame, dedup_window: str) -> DataFrame:
    """Rows seen before within ``dedup_window`` (by ingest time) removed: good rows by ``(hub_id,
    edge_message_id)``, bad rows by file and line."""
    # Good rows are keyed by (hub_id, edge_message_id): the id is unique per hub only. Bad rows are keyed by where
    # they came from, so they never merge with a good row (two byte-identical bad lines in one file are one row).
    good_key = F.concat(F.lit("m:"), F.col("hub_id"), F.lit(":"), F.col("edge_message_id"))
    key = F.when(F.col("reason").isNull(), good_key).otherwise(
        F.concat(F.lit("q:"), F.col("source_file"), F.lit(":"), F.sha2(F.col("line"), 256))
    )
    return (
        classified.withColumn("dedup_key", key)
        .withWatermark("ingest_at", dedup_window)
        .dropDuplicatesWithinWatermark(["dedup_key"])
    )
