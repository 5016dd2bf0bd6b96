"""One local[2] Spark session for the whole test session: starting Spark costs seconds, so it happens once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_upload.settings import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session(
        master="local[2]",
        app_name="edgehub-tests",
        shuffle_partitions=2,
        extra_conf={"spark.ui.enabled": "false", "spark.sql.streaming.minBatchesToRetain": "5"},
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
