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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The cluster test takes minutes: it runs when asked for by marker (``-m cluster``), not in every run."""
    if "cluster" in (config.option.markexpr or ""):
        return
    kept = [item for item in items if item.get_closest_marker("cluster") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
