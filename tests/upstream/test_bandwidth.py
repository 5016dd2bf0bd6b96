"""The bandwidth budget on a manual clock: the bucket holds the rate, the estimator reports it."""

from __future__ import annotations

import asyncio

import pytest

from edgehub.testing import ManualClock
from edgehub.upstream.bandwidth import RateEstimator, TokenBucket, bdp_bytes


def test_bdp_is_rate_times_round_trip_with_a_floor() -> None:
    assert bdp_bytes(64_000, 0.6) == 4800
    assert bdp_bytes(64_000, 0.6, floor=8192) == 8192
    with pytest.raises(ValueError, match="positive"):
        bdp_bytes(0, 1)


async def test_bucket_lets_the_burst_go_at_once_then_waits_for_refill() -> None:
    clock = ManualClock()
    bucket = TokenBucket(rate_bps=8_000, burst_bytes=1000, clock=clock)  # 1000 B/s
    async with asyncio.timeout(5):
        await bucket.take(1000)
        waiter = asyncio.create_task(bucket.take(500))
        await clock.wait_for_sleepers(1)
        assert clock.next_deadline() == pytest.approx(clock.time() + 0.5)
        clock.advance(0.49)
        await asyncio.sleep(0)
        assert not waiter.done()
        clock.advance(0.01)
        await waiter
    assert bucket.tokens == pytest.approx(0.0)


async def test_bucket_lets_a_request_above_the_burst_through_as_a_debt() -> None:
    clock = ManualClock()
    bucket = TokenBucket(rate_bps=8_000, burst_bytes=1000, clock=clock)
    async with asyncio.timeout(5):
        await bucket.take(3000)  # full bucket: goes now, leaves a 2000-byte debt
        assert bucket.tokens == pytest.approx(-2000)
        nxt = asyncio.create_task(bucket.take(100))
        await clock.wait_for_sleepers(1)
        clock.advance(2.1)  # the debt and the next 100 bytes, at 1000 B/s
        await nxt


async def test_unlimited_bucket_never_waits_and_rate_can_change_live() -> None:
    clock = ManualClock()
    bucket = TokenBucket(rate_bps=None, burst_bytes=10, clock=clock)
    async with asyncio.timeout(5):
        await bucket.take(1_000_000)
        bucket.set_rate(80)
        assert bucket.rate_bps == 80


def test_estimator_reports_bits_per_second_over_its_window_and_forgets_old_bytes() -> None:
    clock = ManualClock()
    est = RateEstimator(clock=clock, window_s=10)
    assert est.rate_bps() == 0.0
    for _ in range(10):
        est.record(1000)
        clock.advance(1)
    assert est.rate_bps() == pytest.approx(1000 * 8 * 10 / 10, rel=0.11)
    clock.advance(20)
    assert est.rate_bps() == 0.0
