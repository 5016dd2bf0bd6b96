"""The floor of the cloud job: what Spark itself needs to turn the landing zone into Parquet, nothing else.

    python -m bench.spark_floor --master local[1] --landing DIR --out DIR

Reads the same gzip'ed JSON lines as ``spark_upload.job`` (the same file filter, recursive lookup, the same
record schema ``RECORD_SCHEMA``, the same session settings), and writes the parsed records to Parquet: no
classification, no quarantine, no deduplication, no silver or aggregates, no streaming bookkeeping. A batch read,
the cheapest way Spark has. ``bench.ingest_spark`` runs it beside the job on the same landing zone, and the job's
records/s over this one's is ``job_over_floor``.

It prints the job's own ``ingest.run_done elapsed_s=... cpu_s=...`` line, timed the same way (after the session
started, so JVM start-up is not counted), and the number of rows written, which must be the number of lines.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from pyspark.sql import functions as F

from edgehub.upstream.segment import SEGMENT_SUFFIX
from spark_upload.classification import RECORD_SCHEMA
from spark_upload.metrics import driver_cpu_s
from spark_upload.settings import build_session


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spark_floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--master", default="local[1]")
    p.add_argument("--landing", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shuffle-partitions", type=int, default=4)
    ns = p.parse_args(sys.argv[1:] if argv is None else argv)
    spark = build_session(master=ns.master, app_name="edgehub-floor", shuffle_partitions=ns.shuffle_partitions)
    spark.sparkContext.setLogLevel("WARN")
    try:
        started, cpu_started = time.perf_counter(), driver_cpu_s(spark)
        lines = (
            spark.read.format("text")
            .option("pathGlobFilter", f"*{SEGMENT_SUFFIX}")
            .option("recursiveFileLookup", "true")
            .load(ns.landing)
        )
        records = lines.select(F.from_json("value", RECORD_SCHEMA).alias("r")).select("r.*")
        records.write.mode("overwrite").parquet(ns.out)
        elapsed_s, cpu_s = time.perf_counter() - started, driver_cpu_s(spark) - cpu_started
        written = spark.read.parquet(ns.out).count()
        print(f"floor.rows written={written}", flush=True)
        print(f"ingest.run_done elapsed_s={elapsed_s:.3f} cpu_s={cpu_s:.3f}", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
