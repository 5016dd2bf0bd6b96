"""The AMQP head's settings: listeners, per-connection limits and the bounds that keep a hostile outside from
costing more than they say. Each limit is a keyword field with a safe default, documented on ``AmqpSettings``.

Invariants: an ``AmqpSettings`` is valid once built (``__post_init__`` refuses a limit out of range), and
``connection_cap`` never passes what the process's descriptor limit allows.
"""

from __future__ import annotations

import resource
import ssl
from dataclasses import dataclass, field

from edgehub.core import Clock, SystemClock

__all__ = ["AmqpSettings", "connection_cap"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AmqpSettings:
    """Listener and connection settings.

    * ``host``: the address to listen on (127.0.0.1 in tests).
    * ``tcp_port``: plain AMQP (5672); None (the default) keeps it off. 0 picks a free port.
    * ``tls_port``: AMQP over TLS (5671 by default); needs ``ssl_context``. None turns it off.
    * ``connect_timeout_s``: how long a new socket may take for the TLS handshake, SASL and (after SASL
      ANONYMOUS) its ``$cbs`` token; ``busy_connect_timeout_s`` while over half of the pending slots are used.
    * ``max_connections``, ``descriptor_reserve``, ``max_pending_connections``, ``max_pending_per_address``: as
      the MQTT head's (the same ``ConnectionLimiter``); one descriptor per connection.
    * ``max_login_failures`` per ``login_failure_window_s`` per claimed identity, and
      ``max_login_failures_per_address`` per source address; then logins naming either fail at once.
    * ``max_frame_size``: the largest frame taken (announced in ``open``); larger closes the connection with
      ``amqp:connection:framing-error``.
    * ``max_sessions``: sessions per connection (``channel-max`` + 1).
    * ``max_links``: links attached at once per connection; more close it with ``amqp:resource-limit-exceeded``.
    * ``max_message_size``: the largest message on an incoming link (announced at attach); over it the link is
      closed with ``amqp:link:message-size-exceeded``.
    * ``link_credit``: transfers a client may have unsettled per incoming link; credit comes back as the hub
      settles them (this is the back-pressure: a client waits while the store catches up).
    * ``outbound_window``: deliveries in flight to a module or device (the module endpoint's window).
    * ``max_groups_in_flight``: ingest groups a connection may have waiting on the hub before reading pauses.
    * ``max_waiting_events``: events held while a ``$cbs`` token is being checked (the client pipelined them).
    * ``idle_timeout_s``: a connection that sends no frame for this long is closed (announced in ``open``, so
      clients send empty frames at half of it).
    """

    host: str = "127.0.0.1"
    tcp_port: int | None = None
    tls_port: int | None = 5671
    ssl_context: ssl.SSLContext | None = None
    connect_timeout_s: float = 10.0
    busy_connect_timeout_s: float = 2.0
    max_connections: int | None = None
    descriptor_reserve: int = 256
    max_pending_connections: int = 256
    max_pending_per_address: int = 32
    max_login_failures: int = 5
    max_login_failures_per_address: int = 30
    login_failure_window_s: float = 60.0
    max_frame_size: int = 64 * 1024
    max_sessions: int = 8
    max_links: int = 32
    max_message_size: int = 256 * 1024
    link_credit: int = 256
    outbound_window: int = 16
    max_groups_in_flight: int = 32
    max_waiting_events: int = 64
    idle_timeout_s: float = 240.0
    clock: Clock = field(default_factory=SystemClock)

    def __post_init__(self) -> None:
        positive = {
            "connect_timeout_s": self.connect_timeout_s,
            "busy_connect_timeout_s": self.busy_connect_timeout_s,
            "max_pending_connections": self.max_pending_connections,
            "max_pending_per_address": self.max_pending_per_address,
            "max_login_failures": self.max_login_failures,
            "max_login_failures_per_address": self.max_login_failures_per_address,
            "login_failure_window_s": self.login_failure_window_s,
            "max_sessions": self.max_sessions,
            "max_links": self.max_links,
            "max_message_size": self.max_message_size,
            "link_credit": self.link_credit,
            "outbound_window": self.outbound_window,
            "max_groups_in_flight": self.max_groups_in_flight,
            "max_waiting_events": self.max_waiting_events,
            "idle_timeout_s": self.idle_timeout_s,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be positive, not {value}")
        if not 512 <= self.max_frame_size <= 1 << 24:
            raise ValueError("max_frame_size must be within 512 bytes (AMQP's minimum) and 16 MiB")
        if self.max_connections is not None and self.max_connections < 2:
            raise ValueError("max_connections must be at least 2")
        if self.descriptor_reserve < 0:
            raise ValueError("descriptor_reserve must not be negative")


def connection_cap(settings: AmqpSettings) -> int:
    """The most connections the server takes: one descriptor each under RLIMIT_NOFILE's soft limit, less
    ``descriptor_reserve``; ``max_connections`` if that is lower."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    cap = max(2, soft - settings.descriptor_reserve)
    return cap if settings.max_connections is None else max(2, min(cap, settings.max_connections))
