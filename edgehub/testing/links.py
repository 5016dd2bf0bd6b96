"""``RecordingLink``: a complete ``edgehub.hub.ClientLink`` without a socket, for testing the hub's delivery side.

It has a window (``window`` deliveries unacknowledged at most), records every delivery it was given in ``sent``,
and can be steered: ``refuse_permanently = True`` makes ``send`` raise a PERMANENT ``DeliveryError`` (as the MQTT
head does for a message too large for the client); ``close()`` makes it raise a TRANSIENT one. ``ack(hub,
identity)`` acknowledges the oldest unacknowledged delivery the way a head does (``delivered`` then
``link_ready``); ``wait_sent(n)`` waits for the n-th delivery."""

from __future__ import annotations

import asyncio
from collections import deque

from edgehub.core import DeliveryError, FailureKind, Identity
from edgehub.hub import Delivery, Hub

__all__ = ["RecordingLink"]


class RecordingLink:
    def __init__(self, *, window: int = 16) -> None:
        self.window = window
        self.sent: list[Delivery] = []
        self.unacked: deque[Delivery] = deque()
        self.closed = False
        self.refuse_permanently = False
        self._sent_event = asyncio.Event()

    @property
    def window_free(self) -> int:
        return 0 if self.closed else self.window - len(self.unacked)

    def send(self, delivery: Delivery) -> None:
        if self.closed:
            raise DeliveryError("link closed", endpoint="recording-link", kind=FailureKind.TRANSIENT)
        if self.refuse_permanently:
            raise DeliveryError("too large for this client", endpoint="recording-link", kind=FailureKind.PERMANENT)
        if self.window_free <= 0:
            raise DeliveryError("window full", endpoint="recording-link", kind=FailureKind.TRANSIENT)
        self.sent.append(delivery)
        self.unacked.append(delivery)
        self._sent_event.set()

    async def wait_sent(self, count: int) -> None:
        """Return once ``count`` deliveries were sent. Bound it with ``asyncio.timeout``."""
        while len(self.sent) < count:
            self._sent_event.clear()
            await self._sent_event.wait()

    def close(self) -> None:
        self.closed = True

    def ack(self, hub: Hub, identity: Identity, *, ok: bool = True) -> Delivery:
        delivery = self.unacked.popleft()
        hub.delivered(identity, delivery.delivery_id, ok)
        hub.link_ready(identity, self)
        return delivery
