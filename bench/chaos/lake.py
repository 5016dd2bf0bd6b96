"""python -m bench.chaos.lake --lake DIR --out FILE: the bronze table's rows as JSON lines, for the verifier.

Run as its own process (a Spark session is a JVM: the chaos run keeps it apart so it cannot outlive the run).
Each line: ``device``, ``seq`` and ``cls`` (the device's numbering and class, application properties),
``priority``, ``enqueued_at`` (epoch seconds; the hub's enqueue time, milliseconds), ``edge_message_id``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--lake", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--master", default="local[1]")
    args = ap.parse_args(argv)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master(args.master)
        .appName("chaos-lake")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        bronze = args.lake / "bronze"
        rows = []
        if bronze.exists():
            df = spark.read.parquet(str(bronze)).select(
                F.col("device_id").alias("device"),
                F.col("properties").getItem("seq").alias("seq"),
                F.col("properties").getItem("cls").alias("cls"),
                F.col("priority"),
                (F.unix_millis(F.col("enqueued_at")) / 1000.0).alias("enqueued_at"),
                F.col("edge_message_id"),
            )
            rows = [r.asDict() for r in df.collect()]
        with args.out.open("w") as out:
            for r in rows:
                out.write(json.dumps(r) + "\n")
        print(f"lake: {len(rows)} bronze rows", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
