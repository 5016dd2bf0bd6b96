"""``PahoSubscriber``: a real MQTT client (paho, on its own thread) that subscribes and hands every message it gets
to the asyncio loop that started it: the common part of the test collaborators that listen on a broker
(``MqttCollector``, ``CloudTwinService``).

``start()`` returns once the SUBACK is in, so nothing published after it is missed; each message reaches
``_received(topic, payload, received_at)`` on the loop, in the order the broker delivered them (``received_at``:
``time.monotonic()`` on paho's thread, as it arrived).
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any, Self

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

__all__ = ["PahoSubscriber"]


class PahoSubscriber:
    """Connects to ``host:port`` as ``client_id`` and subscribes to ``subscriptions`` ((filter, QoS) pairs)."""

    def __init__(self, *, host: str, port: int, client_id: str, subscriptions: list[tuple[str, int]]) -> None:
        self.host, self.port = host, port
        self._subscriptions = subscriptions
        self._client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscribed = asyncio.Event()

    def _received(self, topic: str, payload: bytes, received_at: float) -> None:
        """One message, on the loop."""
        raise NotImplementedError

    # paho's thread: hand everything to the loop.
    def _t_on_connect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        c.subscribe(self._subscriptions)

    def _t_on_subscribe(self, c: paho.Client, u: Any, mid: int, rcs: Any, props: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._subscribed.set)

    def _t_on_message(self, c: paho.Client, u: Any, msg: paho.MQTTMessage) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._received, msg.topic, bytes(msg.payload), time.monotonic())

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._client.on_connect = self._t_on_connect
        self._client.on_subscribe = self._t_on_subscribe
        self._client.on_message = self._t_on_message
        await asyncio.to_thread(self._client.connect, self.host, self.port, 30)
        self._client.loop_start()
        await self._subscribed.wait()

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
