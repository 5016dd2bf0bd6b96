"""A real MQTT subscriber (paho, on its own thread) that collects what a broker delivers, for tests and benches.

``start()`` returns once the SUBACK is in, so nothing published after it is missed; ``wait_for(n)`` returns
once ``n`` messages have arrived (bound it with ``asyncio.timeout``). Messages are kept with their arrival
time (``time.monotonic()``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from edgehub.testing.paho_subscriber import PahoSubscriber

__all__ = ["CollectedMessage", "MqttCollector"]


@dataclass(frozen=True, slots=True)
class CollectedMessage:
    topic: str
    payload: bytes
    received_at: float  # time.monotonic()


class MqttCollector(PahoSubscriber):
    """Subscribes to ``topic`` (QoS 1) on ``host:port`` and keeps every message."""

    def __init__(self, *, host: str, port: int, topic: str = "#", client_id: str = "edgehub-collector") -> None:
        super().__init__(host=host, port=port, client_id=client_id, subscriptions=[(topic, 1)])
        self.topic = topic
        self.messages: list[CollectedMessage] = []
        self._arrived = asyncio.Event()

    def _received(self, topic: str, payload: bytes, received_at: float) -> None:
        self.messages.append(CollectedMessage(topic, payload, received_at))
        self._arrived.set()

    async def wait_for(self, count: int) -> None:
        while len(self.messages) < count:
            self._arrived.clear()
            await self._arrived.wait()
