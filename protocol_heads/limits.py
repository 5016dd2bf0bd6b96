"""What both protocol heads' settings share: the listeners, the connection caps, the login throttle's bounds and
the per-connection pacing, each a keyword field with a safe default (``HeadSettings``), and ``connection_cap``,
the most connections a head takes under the process's descriptor limit.

One home for these bounds: ``MqttSettings`` (``protocol_heads.mqtt.settings``) and ``AmqpSettings``
(``protocol_heads.amqp.settings``) subclass ``HeadSettings`` and add their protocol's own limits; the listeners
(``protocol_heads.listeners``) read only what is here.

Invariants: a settings object is valid once built (``__post_init__`` refuses a limit out of range: every name in
``positive_fields`` must be above 0; a subclass's own checks call ``HeadSettings.__post_init__`` first), and
``connection_cap`` never passes what the process's descriptor limit allows.
"""

from __future__ import annotations

import resource
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from edgehub.core import Clock, SystemClock
from edgehub.core.message_size import read_bound_bytes

__all__ = ["HeadSettings", "connection_cap"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadSettings:
    """The settings both heads take.

    * ``host``: the address to listen on (127.0.0.1 in tests).
    * ``tcp_port``: the plain port; None (the default) keeps it off. 0 picks a free port.
    * ``tls_port``: the TLS port (each head's IANA port by default); needs ``ssl_context``. None turns it off.
    * ``connect_timeout_s``: how long a new socket may take for the TLS handshake and the login (the protocol's
      own: MQTT's CONNECT, AMQP's SASL and ``$cbs`` token).
    * ``busy_connect_timeout_s``: the same while over half of ``max_pending_connections`` is in use.
    * ``max_connections``: connections at all (None: as many as the descriptors each takes,
      ``descriptors_per_connection``, allow under the process's RLIMIT_NOFILE less ``descriptor_reserve``; a given
      value is capped by that too). Over it: closed at accept.
    * ``descriptor_reserve``: descriptors kept for everything but client sockets (store, upstream, logs).
    * ``max_pending_connections``: connections accepted but not yet authenticated (at most half of
      ``max_connections``: the rest is for authenticated work). Over it: closed at accept.
    * ``max_pending_per_address``: of those, from one source address.
    * ``max_login_failures`` per ``login_failure_window_s`` per (source address, claimed identity), and
      ``max_login_failures_per_address`` per source address whatever it claims (higher: devices behind one NAT
      share it, and one with a stale key must not lock out the rest); then logins from that address (naming that
      identity, for the pair) are refused at once, without asking the authenticator. Never per identity alone:
      a stranger naming a device must not lock the device out (``edgehub.hub.throttle``).
    * ``outbound_window``: deliveries in flight per client (the module endpoint's window).
    * ``max_groups_in_flight``: ingest groups a connection may have waiting on the hub before reading pauses.
    * ``largest_message_size``: the largest ``maxMessageSizeBytes`` any endpoint of the running deployment takes,
      asked for each new MQTT connection and each new AMQP link (the composition passes the store's
      ``largest_message_size_bytes``); ``read_bound`` makes of it what the head reads of one packet or message.
      None (a head without a deployment, as in the heads' own tests): only the head's own cap applies.
    * ``close_grace_s``: how long a closing connection's goodbye may take (the client reading the rest of our
      writes and hanging up, TLS's close_notify); then its socket is aborted (``SocketSide.goodbye``).
    """

    # Descriptors one connection holds (the MQTT head keeps a second one per socket, for TCP_QUICKACK).
    descriptors_per_connection: ClassVar[int] = 1
    # The fields that must be above 0 (``__post_init__``); a subclass adds its own to these.
    positive_fields: ClassVar[tuple[str, ...]] = (
        "connect_timeout_s",
        "busy_connect_timeout_s",
        "max_pending_connections",
        "max_pending_per_address",
        "max_login_failures",
        "max_login_failures_per_address",
        "login_failure_window_s",
        "close_grace_s",
    )

    host: str = "127.0.0.1"
    tcp_port: int | None = None
    tls_port: int | None = None
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
    outbound_window: int = 16
    max_groups_in_flight: int = 32
    clock: Clock = field(default_factory=SystemClock)
    largest_message_size: Callable[[], int] | None = None
    close_grace_s: float = 5.0

    def read_bound(self, cap: int) -> int:
        """What the head reads of one packet (MQTT) or message (AMQP) now: ``read_bound_bytes`` of the
        deployment's ``largest_message_size``, never more than ``cap`` (the head's own setting); ``cap`` alone
        without a deployment."""
        if self.largest_message_size is None:
            return cap
        return min(cap, read_bound_bytes(self.largest_message_size()))

    def __post_init__(self) -> None:
        for name in self.positive_fields:
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be positive, not {value}")
        if self.max_connections is not None and self.max_connections < 2:
            raise ValueError("max_connections must be at least 2")
        if self.descriptor_reserve < 0:
            raise ValueError("descriptor_reserve must not be negative")


def connection_cap(settings: HeadSettings) -> int:
    """The most connections a head takes: ``descriptors_per_connection`` each under RLIMIT_NOFILE's soft limit,
    less ``descriptor_reserve``; ``max_connections`` if that is lower."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    cap = max(2, (soft - settings.descriptor_reserve) // settings.descriptors_per_connection)
    return cap if settings.max_connections is None else max(2, min(cap, settings.max_connections))
