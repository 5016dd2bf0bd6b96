"""Lane choice at ingest: partition keys, pinning, round-robin with failover, and the lanes' summed status."""

from __future__ import annotations

from collections import Counter

import pytest

from edgehub.core import InvalidMessageError, Message
from edgehub.hub.lanes import (
    PartitionSelector,
    aggregate_status,
    check_partition_properties,
    partition_key,
    stable_partition,
)
from edgehub.upstream.mqtt.settings import UpstreamStatus


def _msg(**sp: str) -> Message:
    return Message(body=b"x", system_properties=sp)


def test_partition_key_is_session_then_partition_key_then_message_id_with_dedup() -> None:
    assert partition_key(_msg(sessionId="s", partitionKey="s", messageId="m")) == "s"
    assert partition_key(_msg(partitionKey="p", messageId="m")) == "p"
    assert partition_key(_msg(messageId="m")) is None
    assert partition_key(_msg(messageId="m"), duplicate_detection=True) == "m"
    assert partition_key(_msg()) is None


def test_session_id_with_a_different_partition_key_is_refused_clearly() -> None:
    with pytest.raises(InvalidMessageError, match="sessionId 's1' and partitionKey 'p1' differ") as info:
        check_partition_properties(_msg(sessionId="s1", partitionKey="p1"))
    assert info.value.reason == "partition_key_mismatch"
    check_partition_properties(_msg(sessionId="s1", partitionKey="s1"))
    check_partition_properties(_msg(sessionId="s1"))
    check_partition_properties(_msg(partitionKey="p1"))


def test_stable_partition_is_fixed_across_runs_and_spreads_keys() -> None:
    assert stable_partition("device-42", 8) == stable_partition("device-42", 8)
    assert stable_partition("device-42", 8) == 5  # pinned value: must not change between releases
    spread = Counter(stable_partition(f"k{i}", 4) for i in range(4000))
    assert set(spread) == {0, 1, 2, 3}
    assert min(spread.values()) > 800


def test_keyed_messages_stay_pinned_even_when_their_lane_is_down() -> None:
    up = {0: True, 1: True, 2: True}
    sel = PartitionSelector(3, is_up=lambda i: up[i])
    lane = sel.choose(_msg(sessionId="ship-7"))
    up[lane] = False
    assert {sel.choose(_msg(sessionId="ship-7")) for _ in range(10)} == {lane}


def test_keyless_messages_go_round_robin_over_up_lanes_and_fail_over_from_a_down_one() -> None:
    up = {0: True, 1: True, 2: True}
    sel = PartitionSelector(3, is_up=lambda i: up[i])
    assert [sel.choose(_msg()) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    up[1] = False
    chosen = [sel.choose(_msg()) for _ in range(6)]
    assert chosen == [0, 2, 0, 2, 0, 2]  # the lanes that are up share evenly


def test_keyless_messages_still_get_a_lane_when_every_lane_is_down() -> None:
    sel = PartitionSelector(2, is_up=lambda i: False)
    assert [sel.choose(_msg()) for _ in range(4)] == [0, 1, 0, 1]


def test_with_duplicate_detection_the_message_id_pins_the_lane() -> None:
    sel = PartitionSelector(4, is_up=lambda i: True, duplicate_detection=True)
    assert {sel.choose(_msg(messageId="m-1")) for _ in range(5)} == {stable_partition("m-1", 4)}


def test_status_aggregates_counts_across_lanes() -> None:
    def st(acked: int, wire: int, connected: bool) -> UpstreamStatus:
        return UpstreamStatus(connected, 1, 10, 100, 1000, 8000.0, acked, 1, wire, wire / acked)

    total = aggregate_status([st(10, 500, False), st(30, 1500, True)])
    assert total.connected
    assert total.messages_acked == 40
    assert total.wire_bytes_per_message == 50.0
    assert total.achieved_bps == 16000.0
