"""A real MQTT subscriber (paho, on its own thread) that collects what a broker delivers, for tests and benches.

``start()`` returns once the SUBACK is in, so nothing published after it is missed; ``wait_for(n)`` returns
once ``n`` messages have arrived (bound it with ``asyncio.timeout``). Messages are kept with their arrival
time (``time.monotonic()``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

__all__ = ["CollectedMessage", "MqttCollector"]


@dataclass(frozen=True, slots=True)
class CollectedMessage:
    topic: str
    payload: bytes
    received_at: float  # time.monotonic()


class MqttCollector:
    """Subscribes to ``topic`` (QoS 1) on ``host:port`` and keeps every message."""

    def __init__(self, *, host: str, port: int, topic: str = "#", client_id: str = "edgehub-collector") -> None:
        self.host, self.port, self.topic = host, port, topic
        self.messages: list[CollectedMessage] = []
        self._client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrived = asyncio.Event()
        self._subscribed = asyncio.Event()

    def _t_on_connect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        c.subscribe(self.topic, qos=1)

    def _t_on_subscribe(self, c: paho.Client, u: Any, mid: int, rcs: Any, props: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._subscribed.set)

    def _t_on_message(self, c: paho.Client, u: Any, msg: paho.MQTTMessage) -> None:
        assert self._loop is not None
        item = CollectedMessage(msg.topic, bytes(msg.payload), time.monotonic())
        self._loop.call_soon_threadsafe(self._add, item)

    def _add(self, item: CollectedMessage) -> None:
        self.messages.append(item)
        self._arrived.set()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._client.on_connect = self._t_on_connect
        self._client.on_subscribe = self._t_on_subscribe
        self._client.on_message = self._t_on_message
        await asyncio.to_thread(self._client.connect, self.host, self.port, 30)
        self._client.loop_start()
        await self._subscribed.wait()

    async def wait_for(self, count: int) -> None:
        while len(self.messages) < count:
            self._arrived.clear()
            await self._arrived.wait()

    async def stop(self) -> None:
        self._client.disconnect()
        await asyncio.to_thread(self._client.loop_stop)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
