"""Devices behind a child hub: a child edgehub logs in to this one as a device (its upstream) and subscribes, for
each device behind it, to ``devices/{d}/messages/devicebound/#`` and ``$iothub/{d}/methods/POST/#``. For a
device the hub's identities say is behind that one (``Hub.is_parent``), the connection then stands in for the
device: a ``ChildLink`` is connected to the hub as that device, so its device-bound messages go out on
``devices/{d}/messages/devicebound/{bag}`` (QoS 1, the child hub's PUBACK the checkpoint) and its method calls on
``$iothub/{d}/methods/POST/{name}/?$rid=``; the child hub answers on ``$iothub/{d}/methods/res/{status}/?$rid=``
(``ModuleCalls.on_publish`` hands that to the hub).

Invariants: a connection stands in only for devices behind its own identity, only once it subscribed for them;
device-bound messages go out only after the device-bound filter (a method filter alone carries calls only); the
bag alone carries the properties (no MQTT 5 properties); everything it stood in for is disconnected from the hub
when the connection ends, and a disposed link holds nothing of the connection. Modules behind a child hub are not
connected: their method calls go through their device's link (``relays_modules``), on
``$iothub/{d}/{m}/methods/POST/...``; nothing device-bound is ever for a module.

It sees the connection's session as ``LinkedSession`` (``link.py``), as the client's own link does.
"""

from __future__ import annotations

import asyncio
import re

from edgehub.core import DeliveryError, FailureKind, Identity, LocalProtocolError
from edgehub.hub import Delivery, Hub
from protocol_heads.mqtt.connection import PeerPacketTooLarge
from protocol_heads.mqtt.iothub import device_bound_topic, topic_matches
from protocol_heads.mqtt.link import LinkedSession

__all__ = ["ChildLink", "Children"]

_SEG = r"([^/#+$][^/#+]*)"
_DEVICEBOUND = re.compile(rf"^devices/{_SEG}/messages/devicebound/#$")
_METHODS = re.compile(rf"^\$iothub/{_SEG}(?:/\+)?/methods/POST/#$")


class ChildLink:
    """A device behind a child hub, as the hub sees it: ``ClientLink`` and ``MethodLink`` over the child's
    connection."""

    def __init__(self, session: LinkedSession, child: Identity) -> None:
        self._session: LinkedSession | None = session  # None once the connection is disposed of
        self.child = child
        self.listening = False  # the device-bound filter is subscribed
        self.pending: dict[int, int] = {}  # packet id -> delivery id

    def detach(self) -> None:
        """The connection is disposed of, or stands in for the device no more: hold nothing of it."""
        self._session = None

    @property
    def window_free(self) -> int:
        session = self._session
        if session is None or not self.listening or session.conn.closed:
            return 0
        return session.conn.window_free

    def send(self, delivery: Delivery) -> None:
        session = self._session
        if session is None or session.conn.closed:
            raise DeliveryError("child hub is not connected", endpoint="mqtt", kind=FailureKind.TRANSIENT)
        topic = device_bound_topic(self.child, delivery.message)
        try:
            packet_id = session.conn.send_message(topic, delivery.message.body, qos=1, dup=delivery.redelivery)
        except PeerPacketTooLarge as exc:
            raise DeliveryError(str(exc), endpoint=session.sock.peer, kind=FailureKind.PERMANENT) from exc
        except LocalProtocolError as exc:
            raise DeliveryError(str(exc), endpoint=session.sock.peer, kind=FailureKind.TRANSIENT) from exc
        assert packet_id is not None
        self.pending[packet_id] = delivery.delivery_id
        session.sock.schedule_flush()

    relays_modules = True  # the device's modules are behind the child hub too

    def send_method_request(self, rid: str, name: str, payload: bytes, target: Identity) -> bool:
        session = self._session
        if session is None or session.conn.closed:
            return False
        topic = f"$iothub/{target.id}/methods/POST/{name}/?$rid={rid}"  # the device, or one of its modules
        if not any(topic_matches(f, topic) for f in session.subscriptions):
            return False
        try:
            session.conn.send_message(topic, payload, qos=0)
        except (PeerPacketTooLarge, LocalProtocolError):
            return False
        session.sock.schedule_flush()
        return True


class Children:
    """The devices one connection stands in for."""

    def __init__(self) -> None:
        self.links: dict[str, ChildLink] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def stand_in(self, session: LinkedSession, topic_filter: str) -> bool:
        """Whether ``topic_filter`` is ``session``'s (a child hub's) for a device behind it; if so, the device is
        connected to the hub through this connection (in a task: the SUBACK does not wait for it)."""
        assert session.identity is not None
        child = self.child_of(session.hub, session.identity, topic_filter)
        if child is not None:
            task = asyncio.get_running_loop().create_task(self.subscribed(session, child, topic_filter))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return child is not None

    @staticmethod
    def child_of(hub: Hub, parent: Identity, topic_filter: str) -> Identity | None:
        """The device behind ``parent`` that ``topic_filter`` subscribes for (None: not such a filter)."""
        m = _DEVICEBOUND.match(topic_filter) or _METHODS.match(topic_filter)
        if m is None or parent.module_id is not None:
            return None
        try:
            child = Identity.parse(m.group(1))
        except ValueError:
            return None
        return child if child != parent and hub.is_parent(parent, child) else None

    async def subscribed(self, session: LinkedSession, child: Identity, topic_filter: str) -> None:
        """``session`` subscribed ``topic_filter`` for ``child`` (already authorized): stand in for it."""
        link = self.links.get(child.id)
        if link is None:
            link = self.links[child.id] = ChildLink(session, child)
            await session.hub.connect(child, link, clean_session=False)
        if _DEVICEBOUND.match(topic_filter) and not link.listening:
            link.listening = True
            session.hub.link_ready(child, link)

    def acked(self, hub: Hub, packet_id: int, ok: bool) -> bool:
        """Settle a child's delivery by its packet id; False when it was none of theirs."""
        for link in self.links.values():
            delivery_id = link.pending.pop(packet_id, None)
            if delivery_id is not None:
                hub.delivered(link.child, delivery_id, ok)
                return True
        return False

    def refill(self, hub: Hub) -> None:
        for link in self.links.values():
            hub.link_ready(link.child, link)

    def dispose(self) -> None:
        """Let go of the connection (also when ``close`` never ran: the hub may still hold a link)."""
        for link in self.links.values():
            link.detach()
        self.links.clear()

    async def close(self, hub: Hub) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)  # connects under way finish, then all leave
        links, self.links = list(self.links.values()), {}
        for link in links:
            await hub.disconnect(link.child, link)
            link.detach()
