"""``CloudTwinService``: the twin side of IoT Hub on a real broker (Mosquitto), for tests of a hub steered from the
cloud. A broker alone does not answer twin GETs; this does, as IoT Hub answers a device's twin requests.

It connects to the broker as one more MQTT client (paho, on its own thread) and keeps one twin:
* ``$iothub/twin/GET/?$rid=N`` is answered on ``$iothub/twin/res/{status}/?$rid=N``: ``answer_status`` (200 by
  default) with ``{"desired": {..., "$version": V}, "reported": {..., "$version": R}}``, or that status with an
  error body (steer it to test a cloud that throttles or fails);
* ``$iothub/twin/PATCH/properties/reported/?$rid=N`` is merged into the reported properties (JSON merge patch) and
  answered ``204`` with ``$version``;
* ``patch(p)`` merges ``p`` into the desired properties, counts their ``$version`` up, and publishes the patch on
  ``$iothub/twin/PATCH/properties/desired/?$version=V`` at QoS 0, as IoT Hub does: a client away at that moment
  does not get it (it must GET the twin when it is back).

Every twin request and its answer happen on the test's event loop, in the order the broker delivered them;
``gets`` counts the GETs answered, ``reports`` the reported patches merged. ``wait_for(condition)`` returns once
``condition()`` holds, checked after each request (bound it with ``asyncio.timeout``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from edgehub.hub.twins import merged

__all__ = ["CloudTwinService"]

GET_FILTER = "$iothub/twin/GET/#"
REPORTED_FILTER = "$iothub/twin/PATCH/properties/reported/#"
DESIRED_PATCH = "$iothub/twin/PATCH/properties/desired/?$version={}"
RESPONSE = "$iothub/twin/res/{}/?$rid={}"


class CloudTwinService:
    """One twin served on ``host:port``; ``desired`` starts as given (its ``$version`` as given, else 1)."""

    def __init__(
        self, *, host: str, port: int, desired: dict[str, Any] | None = None, client_id: str = "cloud-twin-service"
    ) -> None:
        self.host, self.port = host, port
        self.desired: dict[str, Any] = {"$version": 1, **(desired or {})}
        self.reported: dict[str, Any] = {"$version": 1}
        self.answer_status = 200
        self.gets = 0
        self.reports = 0
        self._client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._subscribed = asyncio.Event()

    # paho's thread: hand everything to the loop.
    def _t_on_connect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        c.subscribe([(GET_FILTER, 0), (REPORTED_FILTER, 1)])

    def _t_on_subscribe(self, c: paho.Client, u: Any, mid: int, rcs: Any, props: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._subscribed.set)

    def _t_on_message(self, c: paho.Client, u: Any, msg: paho.MQTTMessage) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._request, msg.topic, bytes(msg.payload))

    # the loop.
    def _request(self, topic: str, payload: bytes) -> None:
        _, _, query = topic.partition("?")
        rid = (parse_qs(query).get("$rid") or [""])[0]
        if topic.startswith("$iothub/twin/GET/"):
            self.gets += 1
            if self.answer_status == 200:
                body: dict[str, Any] = {"desired": self.desired, "reported": self.reported}
            else:
                body = {"errorCode": self.answer_status * 1000 + 1, "message": "steered failure"}
            self._publish(RESPONSE.format(self.answer_status, rid), body)
        else:
            try:
                patch = json.loads(payload)
            except ValueError:
                self._publish(RESPONSE.format(400, rid), {"message": "not JSON"})
                return
            self.reported = {**merged(self.reported, patch), "$version": self.reported["$version"] + 1}
            self.reports += 1
            self._client.publish(f"$iothub/twin/res/204/?$rid={rid}&$version={self.reported['$version']}", b"")
        self._changed.set()

    def _publish(self, topic: str, body: dict[str, Any]) -> None:
        self._client.publish(topic, json.dumps(body).encode(), qos=0)

    def patch(self, patch: dict[str, Any]) -> int:
        """Change the desired properties by ``patch`` and publish it (QoS 0); the new ``$version``."""
        version = int(self.desired["$version"]) + 1
        self.desired = {**merged(self.desired, patch), "$version": version}
        self._publish(DESIRED_PATCH.format(version), patch)
        return version

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self._changed.clear()
            await self._changed.wait()

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
