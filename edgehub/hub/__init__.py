"""The hub facade: the one interface the protocol heads call. Heads never see the router or the store.

A head, for each connected client:
1. ``authenticate(credentials)`` → an ``AuthResult`` (or ``AuthenticationError``);
2. ``connect(identity, link, clean_session=...)`` registers the client as the delivery target of its module
   inputs (a device: of its device-bound messages) and of its direct method calls; the hub then calls
   ``link.send(delivery)`` whenever ``link.window_free`` allows (a head may keep it 0 until the client listens:
   the MQTT head does for a device until it subscribed to its device-bound topic), and the head answers each
   with ``delivered(identity, delivery_id, ok)`` (or, for the acks of one read, one
   ``delivered_many(identity, outcomes)``) and,
   after the acks it read together, one ``link_ready(identity, link)`` (that is when the hub fills the window
   the acks freed: ``delivered`` alone sends nothing);
3. ``ingest(identity, messages)`` for every group of messages that arrived in one read, and acks each message
   only as its outcome says;
4. a link that can also carry direct method calls implements ``edgehub.hub.methods.MethodLink``
   (``send_method_request``); the head hands each answer to ``method_response``;
5. ``disconnect(identity, link)`` when the connection ends (a link that is no longer the registered one, after a
   session takeover, is ignored).

Guarantees the implementations give:
* ``ingest`` returns one outcome per message, in order. ``Stored`` means routed and durable in every queue the
  message goes to (an ack may go out); ``Rejected`` means that message was not stored, and its ``reason`` is a
  stable word of ``edgehub.core.refusals.MESSAGE_REFUSALS`` (``IngestRejected.reason``: ``quota_exceeded``,
  ``too_large``, ``partition_key_mismatch``, ...), which each head maps to its protocol's refusal in one table.
* When the store fails the group's write, ``ingest`` gives no outcome and raises ``StoreError``, and nothing else
  on purpose (a cancelled ``ingest`` gives none either):
  ``StorageIOError`` when the disk refused the write (full, failing) and the store stays usable: the head answers
  every message of the group with ``STORE_UNAVAILABLE``, a refusal the client may retry; any other
  ``StoreError`` (``StoreClosedError`` while the hub stops): the head closes the connection without acking.
  Messages of the group written before the failed write (a group the duplicate window cut in segments, or whose
  messages waited for room in turn) may be durable all the same: they are delivered, and the client's retry may
  store them a second time (at least once, never lost).
* Deliveries to one link go out in queue order; an unacknowledged delivery is sent again with
  ``redelivery=True`` after the client reconnects. ``link.send`` never blocks.

Two protocol-neutral guards every head uses before login: ``ConnectionLimiter`` (``connection_admission.py``:
pre-login connections capped in total and per source address, all connections under the descriptor limit) and
``LoginThrottle`` (``throttle.py``: failed logins per source address and per (address, identity) in a window).
The store's admission of messages (size limits, quotas, overflow policies) is another thing:
``edgehub.store.quotas``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import msgspec

from edgehub.core import Identity, Message
from edgehub.core.methods import MethodCall, MethodResult
from edgehub.core.refusals import STORE_UNAVAILABLE_TEXT, RefusalReason
from edgehub.hub.connection_admission import Cap, ConnectionLimiter, Ticket
from edgehub.hub.throttle import LoginThrottle

__all__ = [
    "STORE_UNAVAILABLE",
    "AuthResult",
    "Cap",
    "Carriage",
    "ClientLink",
    "ConnectionLimiter",
    "Credentials",
    "Delivery",
    "Hub",
    "IngestOutcome",
    "LoginThrottle",
    "Rejected",
    "SessionInfo",
    "Stored",
    "Ticket",
    "TwinLink",
]


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a client presented. ``identity`` is the one it claims (from its client id); ``password`` is a SAS
    token or a plain password; ``cert_thumbprint`` (SHA-256, hex) and ``cert_subject_cn`` come from a TLS
    client certificate the listener verified against its CAs (``cert_chain_verified``)."""

    identity: Identity
    username: str | None = None
    password: bytes | None = None
    cert_thumbprint: str | None = None
    cert_subject_cn: str | None = None
    cert_chain_verified: bool = False


@dataclass(frozen=True, slots=True)
class AuthResult:
    identity: Identity
    auth_method: str  # "sas", "x509", "password": becomes the connectionAuthMethod system property


# A msgspec Struct, not a dataclass: one is built for every message, and its C __init__ takes an eighth of the
# time of a frozen dataclass's (no reference cycles go through it, hence gc=False).
class Stored(msgspec.Struct, frozen=True, gc=False):
    """Routed and durable: the head may ack. ``duplicate``: a copy of a message accepted earlier inside the
    duplicate-detection window, acknowledged and dropped (the earlier copy is the stored one)."""

    edge_message_id: str | None = None
    duplicate: bool = False


# A msgspec Struct, as above: built for every message.
class Rejected(msgspec.Struct, frozen=True, gc=False):
    """Refused at ingest; nothing was stored."""

    reason: RefusalReason
    detail: str = ""


IngestOutcome = Stored | Rejected

# The outcome a head gives each message of a group when ``ingest`` raised ``StorageIOError`` (module docstring).
STORE_UNAVAILABLE = Rejected(RefusalReason.STORE_UNAVAILABLE, STORE_UNAVAILABLE_TEXT)


# A msgspec Struct, as above: built for every message.
class Delivery(msgspec.Struct, frozen=True, gc=False):
    """One message for a connected client. ``input_name`` None means device-bound."""

    delivery_id: int
    message: Message
    input_name: str | None = None
    redelivery: bool = False


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_present: bool = False


class ClientLink(Protocol):
    """A connected client as the hub sees it: a window and a non-blocking send."""

    @property
    def window_free(self) -> int:
        """How many more deliveries the client may have unacknowledged now."""
        ...

    def send(self, delivery: Delivery) -> None:
        """Queue ``delivery`` to the client. Raises ``DeliveryError`` (transient) when the link has closed or
        the window is full; never blocks."""
        ...


@runtime_checkable
class TwinLink(Protocol):
    """A ``ClientLink`` that can also push a twin's desired-properties patch (IoT Hub's
    ``$iothub/twin/PATCH/properties/desired/?$version=N``); a head whose links cannot is simply not pushed to."""

    def send_desired_patch(self, patch: bytes, version: int) -> None:
        """Queue ``patch`` (JSON) to the client if it subscribed to desired patches; never blocks, never raises."""
        ...


class Carriage(Protocol):
    """What the protocols a hub serves its endpoints with can carry, asked at ingest: ``cannot_carry`` gives the
    reason no delivery to ``endpoint`` could ever carry ``message``, over any protocol and to any client that
    could connect for it, or None when one might. The same rule its deliveries fail PERMANENT on (and dead-letter
    the message), asked before the message is stored, so the sender is refused instead."""

    def cannot_carry(self, endpoint: str, message: Message) -> str | None: ...


class Hub(Protocol):
    async def authenticate(self, credentials: Credentials) -> AuthResult:
        """Prove who the client is; raises ``AuthenticationError``."""
        ...

    async def ingest(self, identity: Identity, messages: Sequence[Message]) -> list[IngestOutcome]:
        """Route and durably store a group of messages from one identity; one outcome per message. Raises
        ``StoreError`` only, and then gives no outcome (the module docstring says what each head does)."""
        ...

    async def connect(self, identity: Identity, link: ClientLink, *, clean_session: bool) -> SessionInfo:
        """Make ``link`` the delivery target of ``identity`` (replacing an older link)."""
        ...

    async def disconnect(self, identity: Identity, link: ClientLink) -> None:
        """``link`` is gone; deliveries in flight on it will be redelivered on the next link."""
        ...

    def delivered(self, identity: Identity, delivery_id: int, ok: bool) -> None:
        """The client acknowledged (``ok``) or refused a delivery. Sends nothing: see ``link_ready``."""
        ...

    def delivered_many(self, identity: Identity, outcomes: Iterable[tuple[int, bool]]) -> None:
        """``delivered`` for each ``(delivery_id, ok)``, in one call: the acks a head read together."""
        ...

    def dead_letter(self, identity: Identity, delivery_id: int, reason: str) -> None:
        """The client refused a delivery for good (AMQP's ``rejected``, IoT Hub's reject): it is dead-lettered with
        ``reason``, never delivered again. (A refusal that is not for good, AMQP's ``released``, is ``delivered``
        with ``ok`` False: delivered again.) Sends nothing: see ``link_ready``."""
        ...

    def link_ready(self, identity: Identity, link: ClientLink) -> None:
        """The link's window has room again (deliveries were acknowledged): the hub sends what fits. Call it
        once after the ``delivered`` calls of the acks read together."""
        ...

    def is_parent(self, parent: Identity, child: Identity) -> bool:
        """Whether ``child`` (a device, or a module of one) sits behind the device ``parent`` (a child hub), which may
        then take its device-bound messages and method calls on its behalf."""
        ...

    async def invoke_method(self, caller: str, target: Identity, call: MethodCall) -> MethodResult:
        """Relay a direct method call from ``caller`` (an identity id, or ``$upstream``) to the connected
        ``target`` and return its answer, or IoT Hub's 4xx/5xx; never raises for what the caller sent."""
        ...

    def method_response(self, identity: Identity, rid: str, status: int, payload: bytes) -> bool:
        """``identity`` answered direct method request ``rid`` with ``status`` and ``payload``. False when no call
        sent to it waits for that answer (the head refuses the PUBLISH and logs it; never taken as telemetry)."""
        ...

    async def get_twin(self, identity: Identity) -> Mapping[str, Any]:
        """The identity's twin as IoT Hub returns it to a device (``{"desired": ..., "reported": ...}``)."""
        ...

    async def update_reported(self, identity: Identity, patch: bytes | Mapping[str, Any]) -> int:
        """Merge a reported-properties patch (the raw JSON a device sent, or a ``Mapping``); returns the new
        reported version. Raises ``TwinError`` (with IoT Hub's status) for a patch it refuses, and nothing
        else for any bytes (``edgehub.hub.twins.parse_reported_patch``)."""
        ...
