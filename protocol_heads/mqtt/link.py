"""The ``ClientLink`` the hub sends deliveries through, for one MQTT session: device-bound messages and module
inputs as QoS 1 PUBLISHes (MQTT 5 properties when the client speaks 5), desired-property patches and direct
method calls as QoS 0, each only while the client listens for them.

A link sees its session as ``LinkedSession``, what it may ask of it (``Session`` in ``session.py`` is one, and
builds its link), so this module does not import the session's.

Invariants: a link whose session was disposed of holds nothing (``detach``) and refuses sends as TRANSIENT; a send the
connection's state table refuses is a TRANSIENT ``DeliveryError``, one that can never be sent (``UnsendablePacket``: too
large for the client's Maximum Packet Size, or a topic or property MQTT cannot carry, such as a property bag that makes
the topic longer than 65,535 bytes) a PERMANENT one, so the hub dead-letters it instead of retrying it at the head of
its queue; every send asks the socket side for one flush, not a write each.
"""

from __future__ import annotations

from typing import Protocol

from edgehub.core import DeliveryError, FailureKind, Identity, LocalProtocolError, SystemProperty
from edgehub.hub import Delivery, Hub
from edgehub.mqtt.encoder import UnsendablePacket
from edgehub.mqtt.packets import MQTT_50, NO_PROPERTIES, Properties, PropertyId
from protocol_heads.mqtt.connection import PeerPacketTooLarge, ServerConnection
from protocol_heads.mqtt.iothub import (
    delivery_user_properties,
    device_bound_topic,
    method_request_topic,
    module_input_topic,
    topic_matches,
)
from protocol_heads.socket_side import SessionSocket

__all__ = ["LinkedSession", "SessionLink"]


class LinkedSession(Protocol):
    """What a link (the client's own, or a device's behind a child hub, ``children.py``) may ask of the session
    of the connection it sends on."""

    @property
    def hub(self) -> Hub: ...

    @property
    def conn(self) -> ServerConnection: ...

    @property
    def sock(self) -> SessionSocket: ...

    @property
    def identity(self) -> Identity | None:
        """The authenticated identity; None before login."""
        ...

    @property
    def listening(self) -> bool:
        """Deliveries may go out to the client (its device-bound topic is subscribed, or it is a module)."""
        ...

    @property
    def subscriptions(self) -> set[str]: ...

    def respond(self, topic: str, payload: bytes) -> None:
        """A QoS 0 PUBLISH on ``topic``, if the client subscribed to it."""
        ...


class SessionLink:
    """The ``ClientLink`` the hub sends deliveries through."""

    def __init__(self, session: LinkedSession) -> None:
        self._session: LinkedSession | None = session  # None once the connection is disposed of (no cycle left)
        self.pending: dict[int, int] = {}  # packet id → delivery id

    def detach(self) -> None:
        """The connection is disposed of: hold nothing of it (the hub may hold the link a while longer)."""
        self._session = None

    @property
    def window_free(self) -> int:
        session = self._session
        if session is None:
            return 0
        return session.conn.window_free if session.listening else 0  # a closed connection's window is 0

    def send_desired_patch(self, patch: bytes, version: int) -> None:
        """``TwinLink``: a desired-properties patch, QoS 0 as IoT Hub sends it, if the client subscribed to it."""
        session = self._session
        if session is not None:
            session.respond(f"$iothub/twin/PATCH/properties/desired/?$version={version}", patch)
            session.sock.schedule_flush()  # sent from outside a read: nothing else flushes it

    def send(self, delivery: Delivery) -> None:
        session = self._session
        if session is None:
            raise DeliveryError("client is gone", endpoint="mqtt", kind=FailureKind.TRANSIENT)
        conn = session.conn
        peer = session.sock.peer
        if session.identity is None:
            raise DeliveryError("client is not connected", endpoint=peer, kind=FailureKind.TRANSIENT)
        m = delivery.message
        if delivery.input_name is None:
            topic = device_bound_topic(session.identity, m)
        else:
            topic = module_input_topic(session.identity, delivery.input_name, m)
        props = NO_PROPERTIES  # a 3.1.1 client gets the topic's property bag only
        if conn.protocol_level == MQTT_50:
            values: dict[PropertyId, int | str | bytes] = {}
            ct = m.system_properties.get(SystemProperty.CONTENT_TYPE)
            if ct:
                values[PropertyId.CONTENT_TYPE] = ct
            cid = m.system_properties.get(SystemProperty.CORRELATION_ID)
            if cid:
                values[PropertyId.CORRELATION_DATA] = cid.encode()
            props = Properties(values, delivery_user_properties(m))
        try:
            packet_id = conn.send_message(topic, m.body, qos=1, properties=props, dup=delivery.redelivery)
        except UnsendablePacket as exc:
            raise DeliveryError(f"cannot be sent over MQTT: {exc}", endpoint=peer, kind=FailureKind.PERMANENT) from exc
        except LocalProtocolError as exc:
            # A closed connection is one such misuse (the state table refuses the send): said plainly.
            text = "client is not connected" if conn.closed else str(exc)
            raise DeliveryError(text, endpoint=peer, kind=FailureKind.TRANSIENT) from exc
        assert packet_id is not None
        self.pending[packet_id] = delivery.delivery_id
        # The hub sends a window of deliveries at a time: one write for all of them, not a syscall each.
        session.sock.schedule_flush()

    relays_modules = False  # edgehub.hub.methods.MethodLink: it is the client's own link

    def send_method_request(self, rid: str, name: str, payload: bytes, target: Identity) -> bool:
        """``edgehub.hub.methods.MethodLink``: the call as QoS 0 (as IoT Hub sends them), if the client listens."""
        session = self._session
        if session is None or session.conn.closed:
            return False
        topic = method_request_topic(name, rid)
        if not any(topic_matches(f, topic) for f in session.subscriptions):
            return False  # IoT Hub answers 404 for a device that has not subscribed to its methods
        try:
            session.conn.send_message(topic, payload, qos=0)
        except (PeerPacketTooLarge, LocalProtocolError):
            return False
        session.sock.schedule_flush()
        return True
