"""The MQTT upstream's inbound side: what the broker publishes to the hub, dispatched on the asyncio loop.

Two consumers share the upstream connection (``MqttUpstream`` owns one ``Inbound``):
* the hub's own twin (``twin_channel``): desired patches and twin answers, when a ``TwinChannel`` is attached;
* the cloud's side (``cloud``): device-bound messages and method calls for the identities behind the hub, once
  ``serve_cloud`` is called; its subscriptions are made on every connection, and ``ready`` is set once the
  current connection's SUBACKs are in.

Invariants: every PUBLISH the broker sends is acknowledged on the connection it came on, once handled (the cloud's
side decides when for device-bound messages: once stored); a PUBLISH nobody takes is acknowledged at once; answers
go out on the current connection only, and one with no connection is logged and dropped (a call is live or fails).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from edgehub.core import Clock
from edgehub.core.logtext import shown
from edgehub.core.methods import CloudCommands
from edgehub.core.refusals import RateLimitedLog, RefusalLog
from edgehub.upstream.mqtt.cloud import CloudMessage, CloudSide, subscriptions
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.twin_channel import TwinChannel

if TYPE_CHECKING:
    from edgehub.upstream.mqtt.connection import Connection

__all__ = ["Inbound"]

log = logging.getLogger(__name__)
_SUBSCRIBE_CHUNK = 100  # filters per SUBSCRIBE packet: a few packets, not one of unbounded size


class Inbound:
    """The broker's PUBLISHes to the hub: the twin's and the cloud's. ``current()`` is the live connection."""

    def __init__(
        self, settings: MqttUpstreamSettings, *, clock: Clock, current: Callable[[], Connection | None]
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._current = current
        self.cloud: CloudSide | None = None
        self.ready = asyncio.Event()  # the current connection's cloud subscriptions are acknowledged
        self.twin: TwinChannel | None = None
        # Each connection, and each answer the link is down for, makes a line: the broker and the callers decide
        # how often, so at most RateLimitedLog's burst a minute each.
        self._lines = RateLimitedLog(log, clock=clock)

    def serve_cloud(self, commands: CloudCommands, refusals: RefusalLog | None) -> None:
        self.cloud = CloudSide(
            commands,
            publish=self._cloud_publish,
            refusals=refusals or RefusalLog(log, clock=self._clock),
            clock=self._clock,
        )
        conn = self._current()
        if conn is not None and conn.alive:
            self.subscribe(conn)

    def subscribe(self, conn: Connection) -> None:
        """Make the cloud's subscriptions on ``conn`` (a connection that just came up)."""
        if self.cloud is None:
            return
        devices = list(self.cloud.commands.device_ids())[: self._settings.max_cloud_devices]
        filters = subscriptions(devices)
        self.ready.clear()
        for i in range(0, len(filters), _SUBSCRIBE_CHUNK):
            conn.subscribe(filters[i : i + _SUBSCRIBE_CHUNK])
        if not conn.subscribing:
            self.ready.set()  # nothing to wait for (no devices)
        self._lines.line(
            "subscribed",
            "upstream.cloud_subscribed",
            lane=self._settings.lane,
            devices=len(devices),
            filters=len(filters),
        )

    def subscribed(self, conn: Connection) -> None:
        """Every SUBACK of ``conn``'s cloud subscriptions is in."""
        if conn is self._current():
            self.ready.set()

    def connected(self, conn: Connection) -> None:
        if self.twin is not None:
            self.twin.connected(conn)

    def lost(self) -> None:
        if self.twin is not None:
            self.twin.disconnected()

    def received(self, conn: Connection, m: CloudMessage) -> None:
        """A PUBLISH from the upstream (on the loop): the hub's own twin's, or the cloud's side's."""
        if self.twin is not None and self.twin.takes(m.topic):
            self.twin.received(m.topic, m.payload)
            conn.ack(m.mid, m.qos)
            return
        if self.cloud is None:
            conn.ack(m.mid, m.qos)  # not serving the cloud (yet): nothing subscribed this
            return
        self.cloud.handle(m, lambda: conn.ack(m.mid, m.qos))

    def _cloud_publish(self, topic: str, payload: bytes) -> None:
        conn = self._current()
        if conn is not None and conn.alive:
            conn.publish(topic, payload, 0)
        else:
            self._lines.line(
                "answer_dropped", "upstream.cloud_answer_dropped", lane=self._settings.lane, topic=shown(topic)
            )

    async def close(self) -> None:
        if self.cloud is not None:
            await self.cloud.close()
