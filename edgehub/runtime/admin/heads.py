"""What the admin API reads and does through a serving protocol head (``protocol_heads.listeners.HeadServer``):
typed here as a Protocol so that the AMQP head (python-qpid-proton) is imported only when it serves, and so that
``/status``, ``/metrics`` and the identity routes see every head the same way (a device may be connected over MQTT
and AMQP at once)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from edgehub.core.refusals import RefusalLog
from edgehub.hub.throttle import LoginThrottle

__all__ = ["LiveConnections", "connected_count"]


class LiveConnections(Protocol):
    """A protocol head's live connections and its login counters."""

    @property
    def connected(self) -> list[str]: ...

    logins: LoginThrottle  # failed logins per source address and per (address, identity); may be shared
    refusals: RefusalLog

    def close_identity(self, identity_id: str) -> int: ...


def connected_count(heads: Sequence[LiveConnections]) -> int:
    """Sessions logged in now, over every head: one per identity and head."""
    return sum(len(head.connected) for head in heads)
