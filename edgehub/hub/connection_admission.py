"""Admission of new connections before login: how many may wait unauthenticated, in total and per source
address, and how many connections there may be at all. Protocol-neutral (the MQTT and AMQP heads share it).
Messages are admitted elsewhere, by the store's quotas (``edgehub.store.quotas``).

A connection that has not authenticated costs a descriptor (two, with TLS bookkeeping) and buffers, and a
hostile peer can open them faster than a timeout closes them: without a cap, two such peers took a hub to
20,000 descriptors and real devices could no longer connect. ``ConnectionLimiter.admit(address)`` is asked at
accept, before the TLS handshake; it answers with a ``Ticket`` (counted until released) or with the cap that
was hit.

Invariants:
* ``pending`` (admitted, not yet authenticated) never exceeds ``max_pending``, nor any address's share
  ``max_pending_per_address``; ``total`` (pending and authenticated) never exceeds ``max_connections``.
* ``max_pending`` is at most half of ``max_connections``: the other half is a reserve that only authenticated
  work can use, so a flood of logins never takes the descriptors of devices that did log in.
* A ticket is released exactly once however often ``release`` is called; the per-address table holds only
  addresses with a pending connection, so its size is bounded by ``max_pending``.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Cap", "ConnectionLimiter", "Ticket"]


class Cap(StrEnum):
    """Which cap refused a connection."""

    TOTAL = "total"
    PENDING = "pending"
    PER_ADDRESS = "per_address"


class Ticket:
    """One admitted connection. ``authenticated()`` once it logged in; ``release()`` when it is gone."""

    __slots__ = ("_limiter", "address", "pending")

    def __init__(self, limiter: ConnectionLimiter, address: str) -> None:
        self._limiter: ConnectionLimiter | None = limiter
        self.address = address
        self.pending = True

    def authenticated(self) -> None:
        """The connection logged in: it no longer counts against the pre-login caps (still against the total)."""
        limiter = self._limiter
        if limiter is not None and self.pending:
            self.pending = False
            limiter.unpend(self.address)

    def release(self) -> None:
        """The connection is gone. Idempotent."""
        limiter, self._limiter = self._limiter, None
        if limiter is None:
            return
        if self.pending:
            self.pending = False
            limiter.unpend(self.address)
        limiter.total -= 1
        limiter.closed += 1


class ConnectionLimiter:
    """Counts connections from accept to close, and pre-login ones by source address.

    * ``max_connections``: every connection, authenticated or not (keep it under the descriptor limit).
    * ``max_pending``: connections not yet authenticated (clamped to half of ``max_connections``).
    * ``max_pending_per_address``: of those, from one source address.
    """

    def __init__(self, *, max_connections: int, max_pending: int, max_pending_per_address: int) -> None:
        if max_connections < 2 or max_pending < 1 or max_pending_per_address < 1:
            raise ValueError("max_connections must be at least 2, the pending caps at least 1")
        self.max_connections = max_connections
        self.max_pending = min(max_pending, max_connections // 2)
        self.max_pending_per_address = max_pending_per_address
        self.total = 0
        self.pending = 0
        self.closed = 0  # connections admitted and gone since start (edgehub.runtime.memory watches it)
        self._by_address: dict[str, int] = {}

    @property
    def busy(self) -> bool:
        """More than half of the pre-login cap is in use: time to give new connections less time to log in."""
        return 2 * self.pending > self.max_pending

    def admit(self, address: str) -> Ticket | Cap:
        """A ticket for a new connection from ``address``, or the cap it would pass."""
        if self.total >= self.max_connections:
            return Cap.TOTAL
        if self.pending >= self.max_pending:
            return Cap.PENDING
        held = self._by_address.get(address, 0)
        if held >= self.max_pending_per_address:
            return Cap.PER_ADDRESS
        self._by_address[address] = held + 1
        self.pending += 1
        self.total += 1
        return Ticket(self, address)

    def pending_from(self, address: str) -> int:
        return self._by_address.get(address, 0)

    def unpend(self, address: str) -> None:
        """One connection from ``address`` is no longer pending (a ``Ticket``'s, exactly once per ticket)."""
        self.pending -= 1
        held = self._by_address[address] - 1
        if held:
            self._by_address[address] = held
        else:
            del self._by_address[address]
