"""The chaos verifier's rules on small hand-made runs: what counts as delivered, expired, lost, a duplicate and
an order violation (``bench.chaos.verify``)."""

from __future__ import annotations

from bench.chaos.verify import Acked, LakeRow, Route, verify

ROUTES = {
    "hi": Route(priority=0, lake=True, module=False),
    "short": Route(priority=2, lake=True, module=False, ttl_s=10.0),
    "lo": Route(priority=5, lake=True, module=True),
}
T0 = 1_790_000_000.0


def acked(device: str, seq: int, cls: str, at: float = T0) -> Acked:
    return Acked(device, seq, cls, first_sent_at=at, acked_at=at + 0.01)


def row(device: str, seq: int, priority: int, at: float) -> LakeRow:
    return LakeRow(device, seq, priority, at)


def test_a_message_at_every_destination_of_its_route_is_delivered_and_one_missing_anywhere_is_lost() -> None:
    v = verify(
        acked=[acked("d", 1, "lo"), acked("d", 2, "lo"), acked("d", 3, "hi")],
        routes=ROUTES,
        lake=[row("d", 1, 5, T0 + 1), row("d", 2, 5, T0 + 2), row("d", 3, 0, T0 + 3)],
        module_received={("d", 1): 1},  # #2 never reached the module
        ended_at=T0 + 100,
        kills=3,
    )
    assert (v.acknowledged, v.delivered, v.expired, v.lost, v.kills) == (3, 2, 0, 1, 3)
    assert v.lost_examples[0].startswith("d #2 (lo) missing from module")


def test_an_undelivered_short_ttl_message_is_expired_only_once_its_ttl_could_have_passed() -> None:
    v = verify(
        acked=[acked("d", 1, "short", T0), acked("d", 2, "short", T0 + 95), acked("d", 3, "hi", T0)],
        routes=ROUTES,
        lake=[],
        module_received={},
        ended_at=T0 + 100,
        kills=0,
    )
    # #1: sent 100 s before the end, TTL 10 s: expired. #2: sent 5 s before the end, its TTL cannot have passed:
    # lost. #3: no TTL route, lost whatever the time.
    assert (v.acknowledged, v.delivered, v.expired, v.lost) == (3, 0, 1, 2)


def test_a_second_lake_row_for_one_device_message_is_a_duplicate_and_module_redeliveries_are_not() -> None:
    v = verify(
        acked=[acked("d", 1, "lo")],
        routes=ROUTES,
        lake=[row("d", 1, 5, T0 + 1), row("d", 1, 5, T0 + 2), row("d", 1, 5, T0 + 3)],
        module_received={("d", 1): 2},
        ended_at=T0 + 100,
        kills=0,
    )
    assert (v.delivered, v.duplicates, v.module_redeliveries, v.lost) == (1, 2, 1, 0)


def test_a_lower_number_enqueued_strictly_later_in_one_lane_is_an_order_violation() -> None:
    v = verify(
        acked=[acked("d", n, "lo") for n in range(1, 5)],
        routes=ROUTES,
        lake=[row("d", 1, 5, T0 + 1), row("d", 3, 5, T0 + 2), row("d", 2, 5, T0 + 3), row("d", 4, 5, T0 + 4)],
        module_received={("d", n): 1 for n in range(1, 5)},
        ended_at=T0 + 100,
        kills=0,
    )
    assert v.order_violations == 1
    assert v.order_examples == ["d p5: #2 enqueued at 1790000003.000 after #3 at 1790000002.000"]


def test_order_is_per_device_and_priority_and_a_same_millisecond_tie_is_never_a_violation() -> None:
    v = verify(
        acked=[acked("d", 1, "lo"), acked("d", 2, "hi"), acked("e", 1, "lo"), acked("d", 3, "lo"), acked("d", 4, "lo")],
        routes=ROUTES,
        lake=[
            row("d", 2, 0, T0 + 1),  # a higher number, earlier, in another priority: fine
            row("d", 1, 5, T0 + 2),
            row("e", 1, 5, T0 + 1.5),  # another device
            row("d", 4, 5, T0 + 3),
            row("d", 3, 5, T0 + 3),  # the same millisecond as #4: the lake cannot order them
        ],
        module_received={("d", 1): 1, ("e", 1): 1, ("d", 3): 1, ("d", 4): 1},
        ended_at=T0 + 100,
        kills=0,
    )
    assert (v.order_violations, v.delivered, v.lost) == (0, 5, 0)


def test_a_lake_row_no_device_was_acknowledged_for_is_counted_apart_not_as_delivered() -> None:
    v = verify(
        acked=[acked("d", 1, "hi")],
        routes=ROUTES,
        lake=[row("d", 1, 0, T0 + 1), row("d", 2, 0, T0 + 2)],  # #2 stored, its ack taken by a kill
        module_received={},
        ended_at=T0 + 100,
        kills=1,
    )
    assert (v.acknowledged, v.delivered, v.unacknowledged_in_lake, v.lake_rows) == (1, 1, 1, 2)
    first = ["acknowledged", "delivered", "expired", "lost", "duplicates", "order_violations", "kills"]
    assert list(v.summary())[:7] == first


def test_a_segment_line_out_of_a_devices_order_is_a_violation_even_within_one_millisecond() -> None:
    keys = [("d", 1), ("d", 2), ("d", 3), ("e", 1)]
    v = verify(
        acked=[acked(d, n, "hi") for d, n in keys],
        routes=ROUTES,
        lake=[row(d, n, 0, T0 + 1) for d, n in keys],  # one millisecond: the lake alone cannot tell
        module_received={},
        ended_at=T0 + 100,
        kills=0,
        segments=[[("d", 1), ("e", 1), ("d", 3)], [("d", 3), ("d", 2)], [("d", 1), ("d", 3), ("d", 2), ("e", 1)]],
    )
    assert (v.order_violations, v.segment_order_violations) == (2, 2)
    assert v.order_examples == ["segment 1: d #2 after #3", "segment 2: d #2 after #3"]


def test_a_duplicate_is_a_duplicate_not_also_an_order_violation() -> None:
    keys = [("d", 1), ("d", 2), ("d", 3)]
    v = verify(
        acked=[acked(d, n, "hi") for d, n in keys],
        routes=ROUTES,
        # #2 stored, its ack lost to a kill, #3 stored, then #2 again: a re-send the hub did not recognise
        lake=[row("d", 1, 0, T0 + 1), row("d", 2, 0, T0 + 2), row("d", 3, 0, T0 + 3), row("d", 2, 0, T0 + 4)],
        module_received={},
        ended_at=T0 + 100,
        kills=1,
        segments=[[("d", 1), ("d", 1), ("d", 2)]],
    )
    assert (v.duplicates, v.order_violations, v.delivered) == (1, 0, 3)


def test_a_module_redelivery_is_not_out_of_order_but_a_late_first_arrival_is() -> None:
    keys = [("d", n) for n in range(1, 5)]
    v = verify(
        acked=[acked(d, n, "lo") for d, n in keys],
        routes=ROUTES,
        lake=[row(d, n, 5, T0 + n) for d, n in keys],
        module_received={("d", 1): 1, ("d", 2): 2, ("d", 3): 1, ("d", 4): 1},
        ended_at=T0 + 100,
        kills=1,
        # d #2 arrived again after the kill (not a first arrival), then #4 before #3
        module_first_arrivals=[("d", 1), ("d", 2), ("d", 4), ("d", 3)],
    )
    assert (v.module_order_violations, v.module_redeliveries, v.order_violations, v.lost) == (1, 1, 0, 0)
    assert v.order_examples == ["module 0: d #3 after #4"]
