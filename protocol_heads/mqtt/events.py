"""What ``ServerConnection.receive_data`` tells the server: one event per thing the client did that the server
must act on or know. Values only.

Invariant: every event is a frozen ``msgspec.Struct``, the family of the packets it carries; those built for every
message (``MessageReceived``, ``DeliveryAcked``) hold no reference cycles (``gc=False``).
"""

from __future__ import annotations

import msgspec

from edgehub.core import RemoteProtocolError
from edgehub.mqtt.packets import Connect, Publish, Subscribe, Unsubscribe

__all__ = [
    "ConnectRequested",
    "DeliveryAcked",
    "Disconnected",
    "Event",
    "MessageReceived",
    "ProtocolFailed",
    "SubscribeRequested",
    "UnsubscribeRequested",
]


class ConnectRequested(msgspec.Struct, frozen=True, gc=False):
    """A CONNECT arrived. Answer with ``accept()`` or ``refuse(reason)``."""

    connect: Connect


class MessageReceived(msgspec.Struct, frozen=True, gc=False):
    """A PUBLISH for the hub. ``ticket`` is its ack slot (None for QoS 0): settle it once the hub has
    stored the message (or refused it). The topic alias, if any, is already resolved in ``publish.topic``."""

    publish: Publish
    ticket: int | None


class SubscribeRequested(msgspec.Struct, frozen=True, gc=False):
    """Answer with ``answer_subscribe(packet_id, reason_codes)``."""

    subscribe: Subscribe


class UnsubscribeRequested(msgspec.Struct, frozen=True, gc=False):
    """Answer with ``answer_unsubscribe(packet_id, reason_codes)``."""

    unsubscribe: Unsubscribe


class DeliveryAcked(msgspec.Struct, frozen=True, gc=False):
    """The client acknowledged an outbound QoS 1 message (``reason_code`` ≥ 0x80: it refused it)."""

    packet_id: int
    reason_code: int


class Disconnected(msgspec.Struct, frozen=True, gc=False):
    """The client sent DISCONNECT. ``publish_will`` is True only for MQTT 5's 0x04 (disconnect with will)."""

    reason_code: int
    publish_will: bool
    session_expiry_s: int | None = None


class ProtocolFailed(msgspec.Struct, frozen=True):
    """The client broke the protocol; the connection is CLOSED and the goodbye is in ``data_to_send()``. (An
    exception may reach back to this event through its traceback: collected by the cycle collector.)"""

    error: RemoteProtocolError


Event = (
    ConnectRequested
    | MessageReceived
    | SubscribeRequested
    | UnsubscribeRequested
    | DeliveryAcked
    | Disconnected
    | ProtocolFailed
)
