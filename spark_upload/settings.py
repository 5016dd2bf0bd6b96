"""What the ingestion job is told (``JobSettings``) and the Spark session it relies on (``build_session``).

Invariants: every setting has one default, here, which the command line takes too; a ``JobSettings`` that exists
is valid (the trigger is one of ``TRIGGERS``, the file cap is positive); the session is in UTC (``ingest_date`` is
a UTC date) and keeps its streaming state in RocksDB.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession

__all__ = ["DEDUP_WINDOW", "MAX_RECORDS_PER_FILE", "PROCESSING_INTERVAL", "TRIGGERS", "JobSettings", "build_session"]

# available-now: read what is there, then stop. continuous: a micro-batch every processing_interval.
TRIGGERS = ("available-now", "continuous")
MAX_RECORDS_PER_FILE = 500_000  # rows per Parquet file, in the sink and in compaction
PROCESSING_INTERVAL = "10 seconds"  # Spark interval strings
DEDUP_WINDOW = "6 hours"


@dataclass(frozen=True, slots=True)
class JobSettings:
    """Where the job reads and writes, and how it batches. Paths are Hadoop paths or URLs."""

    landing: str
    lake: str
    checkpoint: str
    trigger: str = TRIGGERS[0]
    processing_interval: str = PROCESSING_INTERVAL
    dedup_window: str = DEDUP_WINDOW
    max_records_per_file: int = MAX_RECORDS_PER_FILE
    max_files_per_trigger: int | None = None
    # continuous: how often the driver looks for new zstd segments to decode (spark_upload.decoding)
    decode_interval_s: float = 5.0
    metrics_path: str | None = None  # also append the lines to this local file ({lake}/_metrics/ gets them anyway)
    print_metrics: bool = True

    def __post_init__(self) -> None:
        if self.trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {', '.join(TRIGGERS)}, not {self.trigger!r}")
        if self.max_records_per_file <= 0:
            raise ValueError("max_records_per_file must be positive")
        if self.decode_interval_s <= 0:
            raise ValueError("decode_interval_s must be positive")


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
        # Counting the state's rows makes every put a get first (does the key exist?): a second RocksDB lookup per
        # input row, for a figure (numRowsTotal in the query progress) nothing here reads. 1,000,000 records: 1.1M
        # lookups instead of 2.1M, their time 1.0 s instead of 1.7 s (progress customMetrics, local[1] pinned).
        "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
        "spark.ui.showConsoleProgress": "false",
        # Timestamps as Parquet's INT64 microseconds, the standard type every reader knows, not Spark's default
        # INT96 (deprecated by Parquet): an INT96 is a 12-byte array, hashed into a dictionary per value, which
        # took a fifth of the job's Parquet writing.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # Segments are small gzip files (~230 KB holding ~4 MB of JSON) that cannot be split. With the default
        # 128 MB per input partition and 4 MB counted per file opened, a 100-file batch became 4 partitions of
        # 31/31/31/7 files: two cores finish unevenly and more cores sit idle. 16 MB gives ~4 files a partition.
        "spark.sql.files.maxPartitionBytes": "16m",
        # No micro-batch without new data: such a batch only moves the dedup watermark and evicts old keys, which
        # the next batch with data does as well, and each costs a planned, committed, metered run of the sink.
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        # The file source hands each micro-batch's files (already listed) to a new file index, which looks at them
        # again, and above this many paths (default 32) does so in a Spark job of one task per file: 4 s of a
        # 100-file batch on one core, for a stat each. Up to 256 the driver stats them itself: microseconds on a
        # local disk or HDFS; on an object store a request each, a few seconds at most, about what scheduling the
        # listing job costs there.
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "256",
        **(extra_conf or {}),
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
