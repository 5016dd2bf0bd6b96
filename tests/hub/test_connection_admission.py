"""ConnectionLimiter: pre-login caps in total and per address, a total cap, and a reserve for logged-in work."""

from __future__ import annotations

import pytest

from edgehub.hub import Cap, ConnectionLimiter, Ticket


def admitted(result: Ticket | Cap) -> Ticket:
    assert isinstance(result, Ticket), result
    return result


def test_pending_connections_are_capped_per_address_and_in_total() -> None:
    limiter = ConnectionLimiter(max_connections=100, max_pending=3, max_pending_per_address=2)
    a1 = admitted(limiter.admit("10.0.0.1"))
    admitted(limiter.admit("10.0.0.1"))
    assert limiter.admit("10.0.0.1") is Cap.PER_ADDRESS
    admitted(limiter.admit("10.0.0.2"))
    assert limiter.admit("10.0.0.3") is Cap.PENDING
    a1.release()
    assert limiter.pending == 2
    admitted(limiter.admit("10.0.0.3"))


def test_a_logged_in_connection_frees_its_pre_login_place_but_counts_in_the_total() -> None:
    limiter = ConnectionLimiter(max_connections=4, max_pending=2, max_pending_per_address=2)
    tickets = [admitted(limiter.admit("10.0.0.1")) for _ in range(2)]
    for t in tickets:
        t.authenticated()
    assert (limiter.pending, limiter.total, limiter.pending_from("10.0.0.1")) == (0, 2, 0)
    admitted(limiter.admit("10.0.0.1"))
    admitted(limiter.admit("10.0.0.1"))
    assert limiter.admit("10.0.0.9") is Cap.TOTAL


def test_the_pre_login_cap_is_at_most_half_the_total_so_logins_keep_a_reserve() -> None:
    limiter = ConnectionLimiter(max_connections=10, max_pending=1000, max_pending_per_address=1000)
    assert limiter.max_pending == 5
    for _ in range(5):
        admitted(limiter.admit("10.0.0.1"))
    assert limiter.admit("10.0.0.1") is Cap.PENDING
    assert limiter.busy


def test_release_is_idempotent_and_the_address_table_empties() -> None:
    limiter = ConnectionLimiter(max_connections=10, max_pending=4, max_pending_per_address=4)
    t = admitted(limiter.admit("10.0.0.1"))
    t.authenticated()
    t.release()
    t.release()
    t.authenticated()
    assert (limiter.pending, limiter.total, limiter._by_address) == (0, 0, {})


def test_busy_once_over_half_the_pre_login_cap() -> None:
    limiter = ConnectionLimiter(max_connections=100, max_pending=4, max_pending_per_address=4)
    admitted(limiter.admit("a"))
    admitted(limiter.admit("b"))
    assert not limiter.busy
    admitted(limiter.admit("c"))
    assert limiter.busy


def test_caps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least"):
        ConnectionLimiter(max_connections=1, max_pending=1, max_pending_per_address=1)
