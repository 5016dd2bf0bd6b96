"""The MQTT head's settings: listeners, per-connection limits, and the bounds that keep a hostile outside from
costing more than they say (issue 15). Each limit is a keyword field with a safe default, documented on
``MqttSettings``; ``edgehub run`` exposes those an operator needs as flags.

Invariants: a ``MqttSettings`` is valid once built (``__post_init__`` refuses a limit out of range), and
``connection_cap`` never passes what the process's descriptor limit allows.
"""

from __future__ import annotations

import resource
import ssl
from dataclasses import dataclass, field

from edgehub.core import Clock, SystemClock
from protocol_heads.mqtt.caches import TOPIC_CACHE_BYTES
from protocol_heads.mqtt.iothub import Acl

__all__ = ["MqttSettings", "connection_cap"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MqttSettings:
    """Listener and connection settings.

    * ``host``: the address to listen on (127.0.0.1 in tests).
    * ``tcp_port``: plain MQTT port; None (the default) keeps it off. 0 picks a free port.
    * ``tls_port``: MQTT over TLS (8883 by default); needs ``ssl_context``. None turns it off.
    * ``connect_timeout_s``: how long a new socket may take for the TLS handshake, CONNECT and authentication.
    * ``busy_connect_timeout_s``: the same while over half of ``max_pending_connections`` is in use.
    * ``max_connections``: connections at all (None: as many as two descriptors each allow under the process's
      RLIMIT_NOFILE less ``descriptor_reserve``; a given value is capped by that too). Over it: closed at accept.
    * ``descriptor_reserve``: descriptors kept for everything but client sockets (store, upstream, logs).
    * ``max_pending_connections``: connections accepted but not yet authenticated (at most half of
      ``max_connections``: the rest is for authenticated work). Over it: closed at accept.
    * ``max_pending_per_address``: of those, from one source address.
    * ``max_login_failures`` per ``login_failure_window_s`` per claimed client id, and
      ``max_login_failures_per_address`` per source address (higher: devices behind one NAT share it, and one
      with a stale key must not lock out the rest); then logins naming either are refused at once (MQTT 5: 0x9F
      connection rate exceeded; 3.1.1: 0x05), without asking the authenticator.
    * ``max_subscriptions``: topic filters per connection; more are refused in SUBACK (0x97 quota exceeded).
    * ``max_filter_length``: the longest topic filter, in UTF-8 bytes; longer is refused (0x8F).
    * ``max_topic_length``: the longest PUBLISH topic name, in characters; longer is refused (0x90).
    * ``topic_cache_bytes``: what each of a connection's topic caches (decoder, encoder, telemetry
      properties) may hold.
    * ``not_reading_timeout_s``: how long a client with keepalive 0 may leave its acks unread (write buffer
      over its high-water mark) before it is aborted; with a keepalive, its timeout (1.5x) applies.
    * ``max_packet_size``: the largest packet accepted (announced to MQTT 5 clients); over it closes with 0x95.
    * ``receive_maximum``: unacknowledged inbound QoS 1/2 messages allowed per client.
    * ``outbound_window``: deliveries in flight per client (the module endpoint's window).
    * ``max_groups_in_flight``: ingest groups a connection may have waiting on the hub before reading pauses.
    * ``acl``: who may publish and subscribe where, beyond the IoT Hub defaults.
    """

    host: str = "127.0.0.1"
    tcp_port: int | None = None
    tls_port: int | None = 8883
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
    max_subscriptions: int = 64
    max_filter_length: int = 1024
    max_topic_length: int = 4096
    topic_cache_bytes: int = TOPIC_CACHE_BYTES
    not_reading_timeout_s: float = 90.0
    max_packet_size: int = 256 * 1024 + 1024
    receive_maximum: int = 1024
    outbound_window: int = 16
    max_groups_in_flight: int = 32
    acl: Acl = field(default_factory=Acl)
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
            "max_subscriptions": self.max_subscriptions,
            "max_filter_length": self.max_filter_length,
            "max_topic_length": self.max_topic_length,
            "not_reading_timeout_s": self.not_reading_timeout_s,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be positive, not {value}")
        if self.max_connections is not None and self.max_connections < 2:
            raise ValueError("max_connections must be at least 2")
        if self.descriptor_reserve < 0 or self.topic_cache_bytes < 0:
            raise ValueError("descriptor_reserve and topic_cache_bytes must not be negative")


def connection_cap(settings: MqttSettings) -> int:
    """The most connections the server takes: two descriptors each (the socket and its TCP_QUICKACK duplicate)
    under RLIMIT_NOFILE's soft limit, less ``descriptor_reserve``; ``max_connections`` if that is lower."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    cap = max(2, (soft - settings.descriptor_reserve) // 2)
    return cap if settings.max_connections is None else max(2, min(cap, settings.max_connections))
