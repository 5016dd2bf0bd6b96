from __future__ import annotations

import random

import pytest

from edgehub.delivery import BackoffFunction, RetryPolicy, effective_policy


def test_phases_follow_each_other() -> None:
    p = RetryPolicy(
        retries_with_no_delay=2,
        minimum_delay_retries=2,
        minimum_delay_s=1,
        maximum_delay_s=16,
        backoff_retries=4,
        backoff_function=BackoffFunction.EXPONENTIAL,
        maximum_delay_retries=2,
    )
    assert [p.delay_s(n) for n in range(1, 12)] == [0, 0, 1, 1, 1, 2, 4, 8, 16, 16, None]


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (BackoffFunction.LINEAR, [3.0, 5.0, 7.0, 9.0]),
        (BackoffFunction.ARITHMETIC, [1.8, 3.4, 5.8, 9.0]),
        (BackoffFunction.GEOMETRIC, [1.7320508075688772, 3.0, 5.196152422706632, 9.0]),
        (BackoffFunction.EXPONENTIAL, [1.0, 2.0, 4.0, 8.0]),
    ],
)
def test_backoff_functions_rise_from_minimum_to_maximum(fn: BackoffFunction, expected: list[float]) -> None:
    p = RetryPolicy(minimum_delay_s=1, maximum_delay_s=9, backoff_retries=4, backoff_function=fn)
    assert [p.delay_s(n) for n in range(1, 5)] == pytest.approx(expected)
    assert p.delay_s(5) == 9  # post-backoff: maximum delay, until TTL by default
    assert p.delay_s(500) == 9


def test_jitter_stays_within_its_fraction() -> None:
    p = RetryPolicy(minimum_delay_retries=100, minimum_delay_s=10, jitter=0.2)
    rng = random.Random(7)
    delays = [p.delay_s(n, rng) for n in range(1, 101)]
    assert all(d is not None and 8 <= d <= 12 for d in delays)
    assert len(set(delays)) > 50


def test_default_policy_is_exponential_1s_to_60s_until_ttl() -> None:
    p = RetryPolicy()
    assert [p.delay_s(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert p.delay_s(10_000) == 60


def test_endpoint_override_wins_unless_hub_ignores_it() -> None:
    hub = RetryPolicy(maximum_delay_s=30)
    ep = RetryPolicy(maximum_delay_s=5, minimum_delay_s=1)
    assert effective_policy(hub, ep) is ep
    assert effective_policy(hub, None) is hub
    strict = RetryPolicy(ignore_endpoint_override=True)
    assert effective_policy(strict, ep) is strict


def test_misconfigured_policy_is_refused() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(minimum_delay_s=10, maximum_delay_s=1)
    with pytest.raises(ValueError):
        RetryPolicy(retries_with_no_delay=-1)
