"""Log lines an outside party can cause, made visible and bounded: at most a few per peer per window.

A hub that refuses quietly cannot be operated (an operator must see 2,000 failed logins), and a hub that logs
every refusal of a hostile peer, or every login of a device that reconnects in a loop, or every call a module
makes to a device that is away, lets that peer fill the disk. ``RateLimitedLog`` is the one place that decides
which of those lines reach the log: each peer (an address, or a client id once it is known) may log ``burst``
lines per ``window_s``; what is held back is counted and said in the peer's next line once its window has
passed (``suppressed=N``). The peers it remembers are bounded too (``max_peers``; the oldest is forgotten).
``RefusalLog`` is the one for refusals: a line reads ``refused reason=REASON peer=ADDR client=ID key=value...``,
reason first so that log searches group by it. Standard library only, like all of ``edgehub.core``.

Invariants:
* ``line`` and ``refused`` never raise for any values given (they are formatted with ``%s``) and cost a dict
  look-up when the line is held back.
* Memory is bounded by ``max_peers`` whatever the peers send.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from enum import StrEnum

from edgehub.core.clock import Clock, SystemClock

__all__ = ["MESSAGE_REFUSALS", "STORE_UNAVAILABLE_TEXT", "RateLimitedLog", "RefusalLog", "RefusalReason"]


class RefusalReason(StrEnum):
    """Why the hub said no. One name per reason, the same in logs, metrics and reason strings."""

    BAD_CREDENTIALS = "bad_credentials"
    BAD_CLIENT_ID = "bad_client_id"
    BAD_USERNAME = "bad_username"
    LOGIN_THROTTLED = "login_throttled"
    NOT_AUTHORIZED = "not_authorized"
    MALFORMED_PACKET = "malformed_packet"
    PACKET_TOO_LARGE = "packet_too_large"
    CONNECT_TIMEOUT = "connect_timeout"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    TOO_MANY_SUBSCRIPTIONS = "too_many_subscriptions"
    FILTER_TOO_LONG = "filter_too_long"
    TOPIC_INVALID = "topic_invalid"
    QUOTA_EXCEEDED = "quota_exceeded"
    MESSAGE_TOO_LARGE = "too_large"
    INVALID_MESSAGE = "invalid"
    TWIN_TOO_LARGE = "twin_too_large"
    TWIN_TOO_DEEP = "twin_too_deep"
    TWIN_INVALID = "twin_invalid"
    KEEPALIVE_TIMEOUT = "keepalive_timeout"
    NO_PENDING_CALL = "no_pending_call"
    STORE_UNAVAILABLE = "store_unavailable"  # the disk refused the write (full, failing)
    PARTITION_KEY_MISMATCH = "partition_key_mismatch"  # sessionId and partitionKey disagree
    REJECTED = "rejected"  # refused at ingest, no more specific reason
    UNDELIVERABLE = "undeliverable"  # no endpoint the routes name could ever carry it (edgehub.hub.Carriage)
    TLS_HANDSHAKE_FAILED = "tls_handshake_failed"
    NOT_READING = "not_reading"
    TOPIC_TOO_LONG = "topic_too_long"
    # the admin API (edgehub.runtime.admin.http): HTTP requests refused before or by their handler
    MALFORMED_REQUEST = "malformed_request"
    REQUEST_TOO_LARGE = "request_too_large"
    REQUEST_TIMEOUT = "request_timeout"
    INVALID_REQUEST = "invalid_request"  # well-formed HTTP, but its JSON or its fields are not what the route takes
    NOT_FOUND = "not_found"
    DEVICE_QUEUE_FULL = "device_queue_full"  # a device's cloud-to-device queue holds its most messages
    UNKNOWN_DEVICE = "unknown_device"  # a cloud-to-device message or method call for an identity the hub lacks
    METHOD_INVALID = "method_invalid"  # a direct method call with a bad name, payload or timeout
    TOO_MANY_CALLS = "too_many_calls"  # pending direct method calls at their bound (per connection, hub-wide)
    DEPLOYMENT_INVALID = "deployment_invalid"  # desired properties refused; the running configuration stays
    DEPLOYMENT_CHECK_FAILED = "deployment_check_failed"  # the manifest check (a child process) failed or timed out
    TOKEN_EXPIRED = "token_expired"  # a connection's SAS token expired without renewal (AMQP CBS)
    UNKNOWN_ADDRESS = "unknown_address"  # an AMQP link to or from a node the hub does not serve
    TOO_MANY_LINKS = "too_many_links"  # AMQP links on one connection over the limit
    # an AMQP connection not yet logged in over its bounds (sessions, links, bytes of unfinished transfers)
    TOO_MUCH_BEFORE_LOGIN = "too_much_before_login"


# The refusals a head answers one message with, the one list each head maps to its protocol's words in one table
# (protocol_heads.mqtt.refusals, protocol_heads.amqp.refusals): the reasons of Hub.ingest's ``Rejected`` outcomes
# (IngestRejected's), the head's own refusals of a message before ingest (its ACL, IoT Hub's topic rules), and
# STORE_UNAVAILABLE, each message of a group whose write the disk refused (the client may send it again later).
MESSAGE_REFUSALS: frozenset[RefusalReason] = frozenset(
    {
        RefusalReason.QUOTA_EXCEEDED,
        RefusalReason.MESSAGE_TOO_LARGE,
        RefusalReason.INVALID_MESSAGE,
        RefusalReason.PARTITION_KEY_MISMATCH,
        RefusalReason.NOT_AUTHORIZED,
        RefusalReason.TOPIC_INVALID,
        RefusalReason.REJECTED,
        RefusalReason.UNDELIVERABLE,
        RefusalReason.STORE_UNAVAILABLE,
    }
)
# What a client is told, whatever its protocol, when its message is refused as STORE_UNAVAILABLE.
STORE_UNAVAILABLE_TEXT = "the hub cannot store messages now (disk full or failing)"


class RateLimitedLog:
    """Rate-limited lines, per peer (any key: an address, an identity, an endpoint, or one name for a condition
    of the whole hub): ``burst`` lines per ``window_s`` per peer; ``max_peers`` peers. ``line`` logs at INFO,
    ``warning`` at WARNING."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        window_s: float = 60.0,
        max_peers: int = 10_000,
        clock: Clock | None = None,
    ) -> None:
        if burst < 1 or window_s <= 0 or max_peers < 1:
            raise ValueError("burst, window_s and max_peers must be positive")
        self._log = logger
        self._burst = burst
        self._window_s = window_s
        self._max_peers = max_peers
        self._clock = clock or SystemClock()
        # peer -> [window start, lines logged in it, lines held back since the last logged one]
        self._peers: OrderedDict[str, list[float]] = OrderedDict()
        self.total = 0  # lines asked for, logged or not
        self.suppressed = 0  # lines held back

    def line(self, peer: str, event: str, /, **fields: object) -> bool:
        """Log ``event key=value...`` unless ``peer`` has used its lines for this window. True when logged."""
        return self._emit(logging.INFO, peer, event, fields)

    def warning(self, peer: str, event: str, /, **fields: object) -> bool:
        """``line`` at WARNING: something is wrong on the hub's side (a store that cannot write)."""
        return self._emit(logging.WARNING, peer, event, fields)

    def _emit(self, level: int, peer: str, event: str, fields: dict[str, object]) -> bool:
        self.total += 1
        now = self._clock.monotonic()
        state = self._peers.get(peer)
        if state is None:
            state = [now, 0.0, 0.0]
            self._peers[peer] = state
            if len(self._peers) > self._max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(peer)
            if now - state[0] >= self._window_s:
                state[0], state[1] = now, 0.0
        if state[1] >= self._burst:
            state[2] += 1
            self.suppressed += 1
            return False
        state[1] += 1
        held = int(state[2])
        state[2] = 0.0
        parts = [event]
        parts.extend(f"{key}={value}" for key, value in fields.items())
        if held:
            parts.append(f"suppressed={held}")
        self._log.log(level, "%s", " ".join(parts))
        return True


class RefusalLog(RateLimitedLog):
    """Rate-limited refusal lines, per peer (``RateLimitedLog``'s bounds)."""

    def refused(self, reason: RefusalReason | str, *, peer: str, client: str | None = None, **detail: object) -> bool:
        """Record a refusal; log it unless ``peer`` has used its lines for this window. True when logged."""
        return self.line(peer, f"refused reason={reason}", peer=peer, client=client or "-", **detail)
