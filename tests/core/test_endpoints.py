"""Endpoint ids and lane names have one home (``edgehub.core.endpoints``): what it builds it parses back, and it
refuses what is not of the kind asked (a parser with None, a builder with ``ValueError``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgehub.core.endpoints import (
    UPSTREAM_ENDPOINT,
    UPSTREAM_LANE,
    is_upstream_endpoint,
    lane_name,
    lane_name_of,
    module_endpoint,
    parse_module_endpoint,
    parse_upstream_lane_id,
    upstream_lane_id,
)
from tests.fuzz.budget import fuzz_settings

# A module id or input name: any non-empty text without "/".
_PART = st.text(min_size=1, max_size=40).filter(lambda s: "/" not in s)


def test_the_upstream_is_spelled_as_routes_name_it() -> None:
    assert UPSTREAM_ENDPOINT == "$upstream"
    assert UPSTREAM_LANE == "upstream"


def test_one_partition_keeps_the_plain_upstream_endpoint_and_lane_name() -> None:
    assert upstream_lane_id(0, 1) == "$upstream"
    assert parse_upstream_lane_id("$upstream") is None
    assert is_upstream_endpoint("$upstream")
    assert lane_name(0, 1) == lane_name_of(None) == "upstream"


@pytest.mark.parametrize(("partition", "partitions"), [(0, 2), (3, 4), (15, 16), (63, 64)])
def test_lane_ids_of_several_partitions_round_trip_and_name_their_lane(partition: int, partitions: int) -> None:
    lane = upstream_lane_id(partition, partitions)
    assert lane == f"$upstream/{partition}"
    assert parse_upstream_lane_id(lane) == partition
    assert is_upstream_endpoint(lane)
    assert lane_name(partition, partitions) == lane_name_of(partition) == f"upstream-p{partition}"


@given(st.integers(min_value=1, max_value=1000).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))))
@fuzz_settings(100)
def test_a_lane_id_and_its_lane_name_agree_for_any_partition_count(case: tuple[int, int]) -> None:
    partition, partitions = case
    # The runtime names a lane's segments from its endpoint id alone: that must give the name lane_name gives.
    assert lane_name_of(parse_upstream_lane_id(upstream_lane_id(partition, partitions))) == lane_name(
        partition, partitions
    )


@pytest.mark.parametrize(
    "endpoint",
    [
        "",
        "$upstream/",
        "$upstream/x",
        "$upstream/01",  # a second spelling of lane 1 would be a second set of queues
        "$upstream/-1",
        "$upstream/+1",
        "$upstream/ 1",
        "$upstream/3/",
        "$upstream/²",  # str.isdigit says yes, int() says no: this parse used to raise
        "$upstream/٣",  # an Arabic-Indic 3: this used to parse as lane 3
        "$UPSTREAM/1",
        "$upstream1",
        "/modules/m/inputs/i",
    ],
)
def test_other_endpoint_ids_are_not_lanes(endpoint: str) -> None:
    assert parse_upstream_lane_id(endpoint) is None
    assert not is_upstream_endpoint(endpoint)


@pytest.mark.parametrize(("partition", "partitions"), [(2, 2), (-1, 2), (0, 0)])
def test_a_partition_outside_the_count_is_refused(partition: int, partitions: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        upstream_lane_id(partition, partitions)
    with pytest.raises(ValueError, match="out of range"):
        lane_name(partition, partitions)


def test_a_negative_partition_has_no_lane_name() -> None:
    with pytest.raises(ValueError, match="negative"):
        lane_name_of(-1)


@pytest.mark.parametrize(
    ("module_id", "input_name"), [("m", "i"), ("filter-1", "in.put"), ("ünï", "a:b"), ("$x", " spaced ")]
)
def test_module_endpoint_ids_round_trip(module_id: str, input_name: str) -> None:
    endpoint = module_endpoint(module_id, input_name)
    assert endpoint == f"/modules/{module_id}/inputs/{input_name}"
    assert parse_module_endpoint(endpoint) == (module_id, input_name)
    assert not is_upstream_endpoint(endpoint)


@given(_PART, _PART)
@fuzz_settings(200)
def test_any_module_and_input_without_a_slash_round_trip(module_id: str, input_name: str) -> None:
    assert parse_module_endpoint(module_endpoint(module_id, input_name)) == (module_id, input_name)


@pytest.mark.parametrize(
    "endpoint",
    [
        "",
        "/",
        "$upstream",
        "$upstream/0",
        "modules/m/inputs/i",
        "//modules/m/inputs/i",
        "/modules//inputs/i",
        "/modules/m/inputs/",
        "/modules/m/inputs/i/",
        "/modules/m/inputs/i/j",
        "/modules/m/outputs/i",
        "/Modules/m/inputs/i",
        "/modules/m/Inputs/i",
        "/modules/m",
    ],
)
def test_malformed_module_endpoint_ids_do_not_parse(endpoint: str) -> None:
    assert parse_module_endpoint(endpoint) is None


@pytest.mark.parametrize(("module_id", "input_name"), [("", "i"), ("m", ""), ("a/b", "i"), ("m", "in/put")])
def test_a_module_endpoint_that_would_not_parse_back_is_refused(module_id: str, input_name: str) -> None:
    with pytest.raises(ValueError, match="module endpoint id"):
        module_endpoint(module_id, input_name)
