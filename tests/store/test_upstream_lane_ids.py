"""Upstream lane endpoint ids are built and parsed in one place (``edgehub.store.queues``)."""

from __future__ import annotations

import pytest

from edgehub.store import QueueId, is_upstream_endpoint, parse_upstream_lane_id, upstream_lane_id


def test_one_partition_keeps_the_plain_upstream_endpoint() -> None:
    assert upstream_lane_id(0, 1) == "$upstream"
    assert parse_upstream_lane_id("$upstream") is None
    assert is_upstream_endpoint("$upstream")


@pytest.mark.parametrize(("partition", "partitions"), [(0, 2), (3, 4), (15, 16)])
def test_lane_ids_of_several_partitions_round_trip(partition: int, partitions: int) -> None:
    lane = upstream_lane_id(partition, partitions)
    assert lane == f"$upstream/{partition}"
    assert parse_upstream_lane_id(lane) == partition
    assert is_upstream_endpoint(lane)
    assert QueueId.parse(QueueId(lane, 5).name) == QueueId(lane, 5)


@pytest.mark.parametrize(
    "endpoint", ["$upstream/", "$upstream/x", "$upstream/01", "$upstream/-1", "/modules/m/inputs/i"]
)
def test_other_endpoint_ids_are_not_lanes(endpoint: str) -> None:
    assert parse_upstream_lane_id(endpoint) is None
    assert not is_upstream_endpoint(endpoint)


def test_a_partition_outside_the_count_is_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        upstream_lane_id(2, 2)
