"""How the lake's files are written (spark_upload.tables.write_capped), and what device_minute counts."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_upload.tables import device_minute_partials, write_capped


def _encodings(spark: SparkSession, folder: Path) -> dict[str, tuple[bool, str]]:
    """Per column of the Parquet files in ``folder``: whether it has a dictionary page, and its encodings."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    parquet = jvm.org.apache.parquet.hadoop
    found: dict[str, tuple[bool, str]] = {}
    for file in sorted(folder.glob("*.parquet")):
        source = parquet.util.HadoopInputFile.fromPath(jvm.org.apache.hadoop.fs.Path(str(file)), conf)
        reader = parquet.ParquetFileReader.open(source)
        try:
            for block in reader.getFooter().getBlocks():
                for column in block.getColumns():
                    found[column.getPath().toDotString()] = (
                        column.hasDictionaryPage(),
                        column.getEncodings().toString(),
                    )
        finally:
            reader.close()
    return found


@pytest.mark.spark
def test_columns_that_differ_row_by_row_are_written_without_a_dictionary(spark: SparkSession, tmp_path: Path) -> None:
    # Few distinct values in every column, so Parquet would keep a dictionary for each (with all values distinct,
    # it drops the dictionary at the first page and the files look the same: only the work differs).
    rows = spark.range(20_000).selectExpr(
        "cast(id % 5 as string) as edge_message_id",
        "cast(id % 5 as string) as device_id",
        "cast(cast(id % 3 as string) as binary) as body",
        "timestamp_micros(id % 7) as enqueued_at",
    )
    write_capped(rows, str(tmp_path / "t"), max_records_per_file=100_000)
    found = _encodings(spark, tmp_path / "t")
    assert set(found) == {"edge_message_id", "device_id", "body", "enqueued_at"}
    assert {name for name, (dictionary, _) in found.items() if dictionary} == {"device_id"}
    # And the rows read back as written.
    assert spark.read.parquet(str(tmp_path / "t")).exceptAll(rows).count() == 0


# Top-level field values of every JSON kind, numbers in each form parse_json stores them (integers of each width,
# decimals, doubles past the decimal range), and strings that look like numbers.
_FIELD_VALUES = [
    "0",
    "-0",
    "7",
    "-128",
    "40000",
    "-2147483649",
    "9007199254740993",
    "-9223372036854775808",
    "21.5",
    "-0.001",
    "0.30000000000000004",
    "123456789.123456789",
    "1e3",
    "-2.5E-7",
    "1.7976931348623157e308",
    "12345678901234567890123456789012345678901",
    '"12"',
    '"-1"',
    '""',
    "true",
    "false",
    "null",
    '{"a": 1}',
    "[1, 2]",
    "[]",
]


@pytest.mark.spark
def test_device_minute_counts_the_fields_whose_values_are_json_numbers_and_sums_them_as_doubles(
    spark: SparkSession,
) -> None:
    # The rule device_minute_partials states, written the slow way: a field counts when its value's variant type
    # is numeric, and its x is that variant cast to double.
    bodies = [(f"d{i % 3}", "{" + f'"f{i}": {value}, "g": {value}' + "}") for i, value in enumerate(_FIELD_VALUES)]
    bodies += [("d0", "[1, 2]"), ("d1", "42"), ("d2", "not json"), ("d0", "{}")]
    silver = spark.createDataFrame(bodies, "device_id string, text string").selectExpr(
        "device_id", "timestamp'2026-11-26 10:00:30' AS enqueued_at", "try_parse_json(text) AS body"
    )
    got = device_minute_partials(silver, 7).collect()

    numeric = r"^(TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL)"
    entries = silver.selectExpr(
        "device_id", "explode(coalesce(try_cast(body AS map<string, variant>), map())) AS (field, value)"
    ).where(F.schema_of_variant("value").rlike(numeric))
    expected_fields = entries.groupBy("device_id", "field").agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.col("value").cast("double")).alias("sum"),
        F.min(F.col("value").cast("double")).alias("min"),
        F.max(F.col("value").cast("double")).alias("max"),
    )
    expected = {(r.device_id, r.field): (r.n, r.sum, r.min, r.max) for r in expected_fields.collect()}
    for r in silver.groupBy("device_id").count().collect():  # each message's counting entry
        expected[(r.device_id, None)] = (r["count"], None, None, None)

    assert {(r.device_id, r.field): (r.n, r["sum"], r["min"], r["max"]) for r in got} == expected
    assert {r.minute.isoformat() for r in got} == {"2026-11-26T10:00:00"}
    assert {r.batch_id for r in got} == {7}
    # the fields counted are the number ones: the strings "12" and "-1" are not, nor true, null, {...} or [...]
    counted = {r.field for r in got if r.field is not None and r.field != "g"}
    assert counted == {f"f{i}" for i, value in enumerate(_FIELD_VALUES) if value[0] in "-0123456789"}
