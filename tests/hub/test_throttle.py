"""LoginThrottle: after a few failures in a window, attempts naming the key are refused at once; bounded."""

from __future__ import annotations

from edgehub.hub import LoginThrottle
from edgehub.testing import ManualClock


def test_a_key_is_blocked_after_its_failures_and_free_again_after_the_window() -> None:
    clock = ManualClock()
    throttle = LoginThrottle(max_failures=3, window_s=60.0, clock=clock)
    for _ in range(2):
        throttle.failed("address:10.0.0.1", "client:dev1")
    assert not throttle.blocked("address:10.0.0.1")
    throttle.failed("address:10.0.0.1", "client:dev1")
    assert throttle.blocked("client:dev1")
    assert throttle.blocked("address:10.0.0.2", "client:dev1")  # any key given that is blocked
    assert not throttle.blocked("address:10.0.0.2", "client:dev2")
    clock.advance(60.0)
    assert not throttle.blocked("address:10.0.0.1", "client:dev1")
    throttle.failed("client:dev1")  # a new window starts at one
    assert not throttle.blocked("client:dev1")


def test_a_success_clears_only_the_key_given() -> None:
    throttle = LoginThrottle(max_failures=1, clock=ManualClock())
    throttle.failed("address:a", "client:dev1")
    throttle.succeeded("client:dev1")
    assert not throttle.blocked("client:dev1")
    assert throttle.blocked("address:a")


def test_memory_is_bounded_by_max_keys() -> None:
    throttle = LoginThrottle(max_failures=1, max_keys=100, clock=ManualClock())
    for i in range(10_000):
        throttle.failed(f"client:guess{i}")
    assert len(throttle) == 100
    assert throttle.blocked("client:guess9999")
    assert not throttle.blocked("client:guess0")  # forgotten first
