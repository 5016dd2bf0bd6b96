"""LoginThrottle: after a few failures in a window, attempts from the address (or naming the identity from that
address) are refused at once; another address's valid login is never held back; bounded."""

from __future__ import annotations

from edgehub.hub import LoginThrottle
from edgehub.testing import ManualClock


def test_an_address_identity_pair_is_blocked_after_its_failures_and_free_again_after_the_window() -> None:
    clock = ManualClock()
    throttle = LoginThrottle(max_failures=3, max_failures_per_address=10, window_s=60.0, clock=clock)
    for _ in range(2):
        throttle.failed("10.0.0.1", "dev1")
    assert not throttle.blocked("10.0.0.1", "dev1")
    throttle.failed("10.0.0.1", "dev1")
    assert throttle.blocked("10.0.0.1", "dev1")
    assert not throttle.blocked("10.0.0.1", "dev2")  # the address has failures left for other identities
    clock.advance(60.0)
    assert not throttle.blocked("10.0.0.1", "dev1")
    throttle.failed("10.0.0.1", "dev1")  # a new window starts at one
    assert not throttle.blocked("10.0.0.1", "dev1")


def test_failures_naming_a_device_from_one_address_do_not_block_it_from_another() -> None:
    throttle = LoginThrottle(max_failures=5, max_failures_per_address=30, clock=ManualClock())
    for _ in range(50):
        throttle.failed("10.0.0.66", "dev1")
    assert throttle.blocked("10.0.0.66", "dev1")
    assert not throttle.blocked("10.0.0.2", "dev1")


def test_an_address_that_fails_for_many_identities_is_blocked_for_all() -> None:
    throttle = LoginThrottle(max_failures=5, max_failures_per_address=3, clock=ManualClock())
    for n in range(3):
        throttle.failed("10.0.0.66", f"guess{n}")
    assert throttle.blocked("10.0.0.66", "dev1")
    assert not throttle.blocked("10.0.0.2", "dev1")


def test_a_success_clears_only_its_own_pair() -> None:
    throttle = LoginThrottle(max_failures=1, max_failures_per_address=2, clock=ManualClock())
    throttle.failed("a", "dev1")
    assert throttle.blocked("a", "dev1")
    throttle.succeeded("a", "dev1")
    assert not throttle.blocked("a", "dev1")
    throttle.failed("a", "dev2")
    assert throttle.blocked("a", "dev3")  # the address's two failures stand


def test_identities_are_keyed_by_their_first_128_characters() -> None:
    throttle = LoginThrottle(max_failures=1, clock=ManualClock())
    throttle.failed("a", "x" * 128 + "one")
    assert throttle.blocked("a", "x" * 128 + "two")


def test_memory_is_bounded_by_max_keys() -> None:
    throttle = LoginThrottle(max_failures=1, max_keys=100, clock=ManualClock())
    for i in range(10_000):
        throttle.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", f"guess{i}")
    assert len(throttle) == 100
    assert throttle.blocked("10.0.39.15", "guess9999")
    assert not throttle.blocked("10.0.0.0", "guess0")  # forgotten first
