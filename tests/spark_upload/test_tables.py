"""How the lake's files are written (spark_upload.tables.write_capped)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_upload.tables import write_capped


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
