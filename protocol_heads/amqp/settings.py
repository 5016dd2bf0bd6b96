"""The AMQP head's settings: what both heads share (``HeadSettings``: listeners, connection caps, the login
throttle, pacing; ``protocol_heads.limits``) and AMQP's own per-connection limits, the bounds that keep a hostile
outside from costing more than they say. Each limit is a keyword field with a safe default, documented on
``AmqpSettings``.

Invariants: an ``AmqpSettings`` is valid once built (``__post_init__`` refuses a limit out of range), and
``connection_cap`` never passes what the process's descriptor limit allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from edgehub.core.message_size import MAX_MESSAGE_SIZE_BYTES, WIRE_ENVELOPE_BYTES
from protocol_heads.limits import HeadSettings, connection_cap

__all__ = ["AmqpSettings", "connection_cap"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AmqpSettings(HeadSettings):
    """Listener and connection settings: ``HeadSettings``' fields (one descriptor per connection), with these of
    AMQP's own.

    * ``tls_port``: AMQP over TLS, 5671 by default (plain AMQP's is 5672, off unless given).
    * ``max_frame_size``: the largest frame taken (announced in ``open``); larger closes the connection with
      ``amqp:connection:framing-error``.
    * ``max_sessions``: sessions per connection (``channel-max`` + 1).
    * ``max_links``: links attached at once per connection; more close it with ``amqp:resource-limit-exceeded``.
    * ``max_message_size``: the most a message on an incoming link may be; each link takes messages up to the
      deployment's bound under it, as it is when the link is attached (``read_bound``), announced in its
      ``max-message-size``; over it the link is closed with ``amqp:link:message-size-exceeded``.
    * ``link_credit``: transfers a client may have unsettled per incoming link; credit comes back as the hub
      settles them (this is the back-pressure: a client waits while the store catches up).
    * ``max_waiting_events``: events held while a ``$cbs`` token is being checked (the client pipelined them).
    * ``idle_timeout_s``: a connection that sends no frame for this long is closed (announced in ``open``, so
      clients send empty frames at half of it).
    * ``max_sessions_before_login``, ``max_links_before_login``, ``max_unfinished_bytes_before_login``: what a
      connection may hold before its client has logged in (SASL ANONYMOUS leaves it so until a ``$cbs`` token is
      checked): sessions, links, and bytes of transfers not yet whole (or held for the token's check). Past one,
      it is closed with ``amqp:resource-limit-exceeded``. A put-token needs one session, two links and a few KB.
    """

    positive_fields: ClassVar[tuple[str, ...]] = (
        *HeadSettings.positive_fields,
        "max_sessions",
        "max_links",
        "max_message_size",
        "link_credit",
        "outbound_window",
        "max_groups_in_flight",
        "max_waiting_events",
        "idle_timeout_s",
        "max_sessions_before_login",
        "max_links_before_login",
        "max_unfinished_bytes_before_login",
    )

    tls_port: int | None = 5671
    max_frame_size: int = 64 * 1024
    max_sessions: int = 8
    max_links: int = 32
    # The hub's hard cap on a message and its framing (edgehub.core.message_size); each link reads up to the
    # deployment's bound under it (read_bound), and the store holds each message to its routes' limits, live.
    max_message_size: int = MAX_MESSAGE_SIZE_BYTES + WIRE_ENVELOPE_BYTES
    link_credit: int = 256
    max_waiting_events: int = 64
    idle_timeout_s: float = 240.0
    max_sessions_before_login: int = 2
    max_links_before_login: int = 8
    max_unfinished_bytes_before_login: int = 64 * 1024

    def __post_init__(self) -> None:
        HeadSettings.__post_init__(self)  # not super(): a slotted dataclass is a new class, its __class__ cell stale
        if not 512 <= self.max_frame_size <= 1 << 24:
            raise ValueError("max_frame_size must be within 512 bytes (AMQP's minimum) and 16 MiB")
