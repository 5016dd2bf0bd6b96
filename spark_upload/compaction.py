"""Compaction: rewrite old table partitions into fewer, fuller files.

The sink writes each batch's files (at most ``max_records_per_file`` rows each), so a day of small batches leaves
many small files. ``compact`` rewrites each partition older than a given day into as few files as the cap allows.

Invariants: it never touches a partition of ``before`` or later, and so not today's, into which the job may be
writing (run it for older days only, or when the job is stopped); no row is lost or doubled: the new files are
written to ``_compact/`` first, the old ones moved to ``_compact_trash/``, then the new ones moved in
(``spark_upload.tables.move_in``, tagged ``c{time}``) before the trash is deleted. A partition of one file is
left as it is.
"""

from __future__ import annotations

import logging
import posixpath
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from spark_upload.settings import MAX_RECORDS_PER_FILE
from spark_upload.spark_internals import HadoopDir, check_spark
from spark_upload.tables import TABLES, move_in, partition, write_capped

__all__ = ["compact"]

_log = logging.getLogger(__name__)


def compact(
    spark: SparkSession, lake_root: str, *, before: str, max_records_per_file: int = MAX_RECORDS_PER_FILE
) -> dict[str, int]:
    """Rewrite each table partition with ``ingest_date < before`` (ISO date) into as few files as the cap allows.

    Returns ``{table/partition: files_after}`` for the partitions it rewrote (those with more than one file).
    The swap is: write to ``_compact/...``, move the old files to ``_compact_trash``, move the new ones in.
    """
    check_spark(spark)
    lake = HadoopDir(spark, lake_root)
    done: dict[str, int] = {}
    for table in TABLES:
        for part in lake.glob(f"{table}/{partition('*')}"):
            folder = posixpath.basename(part)
            day = folder.split("=", 1)[1]
            if day >= before:
                continue
            files = lake.glob(f"{table}/{folder}/part-*")
            if len(files) <= 1:
                continue
            frame = spark.read.parquet(*[lake.uri(f) for f in files])
            rows = frame.count()
            n_files = max(1, -(-rows // max_records_per_file))
            lake.delete("_compact", table, folder)
            write_capped(
                frame.repartition(n_files),
                lake.uri("_compact", table, folder),
                max_records_per_file=max_records_per_file,
            )
            lake.mkdirs("_compact_trash", table, folder)
            for f in files:
                lake.rename(f, f"_compact_trash/{table}/{folder}/{posixpath.basename(f)}")
            stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
            n_after = move_in(lake, lake.glob(f"_compact/{table}/{folder}/part-*"), table, day, tag=f"c{stamp}")
            lake.delete("_compact_trash", table, folder)
            lake.delete("_compact", table, folder)
            done[f"{table}/{folder}"] = n_after
            _log.info(
                "ingest.compacted table=%s partition=%s files_before=%d files_after=%d",
                table,
                day,
                len(files),
                n_after,
            )
    return done
