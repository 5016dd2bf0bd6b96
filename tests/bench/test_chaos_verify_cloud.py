"""The chaos verifier's cloud rules on small hand-made runs (``bench.chaos.verify_cloud``): which answers to a
direct method call are right, when no answer is allowed, and what counts as a lost cloud-to-device message."""

from __future__ import annotations

from bench.chaos.cloud import Call
from bench.chaos.verify_cloud import CloudVerdict, verify_cloud

T0 = 1_790_000_000.0
DEV = "cmd-0"


def call(n: int, name: str, *answers: tuple[int, bytes, float], at: float = T0) -> Call:
    return Call(str(n), DEV, name, 10.0, at, f'{{"call": "{n}"}}'.encode(), list(answers))


def check(
    calls: list[Call],
    *,
    answered: tuple[str, ...] = (),
    connected: tuple[tuple[float, float], ...] = (),
    disruptions: tuple[tuple[float, float], ...] = (),
) -> CloudVerdict:
    return verify_cloud(
        c2d_acked=[],
        c2d_received={},
        calls=calls,
        answered={DEV: list(answered)},
        connected={DEV: list(connected)},
        disruptions=list(disruptions),
    )


def test_an_echo_answered_200_with_its_own_payload_is_right_and_with_another_payload_is_wrong() -> None:
    good = call(1, "echo", (200, b'{"call": "1"}', T0 + 0.1))
    bad = call(2, "echo", (200, b'{"call": "1"}', T0 + 0.1))
    v = check([good, bad], answered=("1", "2"), connected=((T0 - 5, T0 + 5),))
    assert (v.methods_called, v.methods_answered, v.methods_wrong) == (2, 1, 1)
    assert "not its own payload" in v.examples[0]


def test_a_404_is_right_only_when_the_target_was_not_connected_the_whole_time() -> None:
    away = call(1, "echo", (404, b"{}", T0 + 0.1))
    v = check([away], connected=((T0 + 0.05, T0 + 9),))  # it connected after the call was made
    assert (v.methods_not_connected, v.methods_wrong) == (1, 0)
    v = check([away], connected=((T0 - 1, T0 + 9),))
    assert (v.methods_not_connected, v.methods_wrong) == (0, 1)


def test_an_ignored_call_is_answered_504_not_before_its_timeout() -> None:
    on_time = call(1, "ignore", (504, b"{}", T0 + 10.2))
    early = call(2, "ignore", (504, b"{}", T0 + 3.0))
    answered_200 = call(3, "ignore", (200, b'{"call": "3"}', T0 + 0.1))
    v = check([on_time, early, answered_200], connected=((T0 - 1, T0 + 20),))
    assert (v.methods_timed_out, v.methods_wrong) == (1, 2)
    assert any("before its 10 s timeout" in e for e in v.examples)


def test_an_echo_the_target_answered_or_could_have_answered_must_not_time_out() -> None:
    answered_then_504 = call(1, "echo", (504, b"{}", T0 + 10.1))
    connected_then_504 = call(2, "echo", (504, b"{}", T0 + 10.1))
    away_then_504 = call(3, "echo", (504, b"{}", T0 + 10.1))
    v = check([answered_then_504, connected_then_504], answered=("1",), connected=((T0 - 1, T0 + 10.5),))
    # #3: the target was away when the hub held the call: 504 is right; #1 and #2 are not.
    v3 = check([away_then_504], connected=((T0 + 5, T0 + 30),))
    assert (v.methods_wrong, v3.methods_timed_out, v3.methods_wrong) == (2, 1, 0)


def test_no_answer_is_allowed_only_with_a_kill_or_an_outage_in_the_calls_life() -> None:
    lost = call(1, "echo")
    in_outage = check([lost], disruptions=((T0 + 20, T0 + 40),))  # within timeout + margin of the call
    no_outage = check([lost], disruptions=((T0 + 60, T0 + 70),))
    assert (in_outage.methods_unanswered, in_outage.methods_wrong) == (1, 0)
    assert (no_outage.methods_unanswered, no_outage.methods_wrong) == (0, 1)


def test_a_call_just_after_a_disruption_ended_may_go_unanswered_while_the_hub_subscribes_again() -> None:
    lost = call(1, "echo")
    just_after = check([lost], disruptions=((T0 - 30, T0 - 1),))  # the call came 1 s after the link was back
    long_after = check([lost], disruptions=((T0 - 30, T0 - 11),))  # 11 s after: the hub had settled
    assert (just_after.methods_unanswered, just_after.methods_wrong) == (1, 0)
    assert (long_after.methods_unanswered, long_after.methods_wrong) == (0, 1)


def test_a_second_answer_or_an_answer_to_no_call_is_wrong() -> None:
    twice = call(1, "echo", (200, b'{"call": "1"}', T0 + 0.1), (200, b'{"call": "1"}', T0 + 0.2))
    v = verify_cloud(
        c2d_acked=[],
        c2d_received={},
        calls=[twice],
        answered={DEV: ["1"]},
        connected={DEV: [(T0 - 1, T0 + 1)]},
        disruptions=[],
        stray_answers=["$iothub/cmd-0/methods/res/200/?$rid=99"],
    )
    assert v.methods_wrong == 2


def test_a_cloud_to_device_message_the_broker_acknowledged_must_reach_the_device_at_least_once() -> None:
    v = verify_cloud(
        c2d_acked=[1, 2, 3, 4],
        c2d_received={1: 1, 2: 2, 4: 1, 5: 1},  # 5: sent, its broker ack not seen yet: not counted either way
        calls=[],
        answered={},
        connected={},
        disruptions=[],
    )
    assert (v.c2d_acknowledged, v.c2d_delivered, v.c2d_lost, v.c2d_redeliveries) == (4, 3, 1, 1)
    assert v.examples == ["cloud-to-device #3 acknowledged by the broker, never at the device"]
