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
from typing import Any
from urllib.parse import parse_qs

from edgehub.hub.twins import merged
from edgehub.testing.paho_subscriber import PahoSubscriber

__all__ = ["CloudTwinService"]

GET_FILTER = "$iothub/twin/GET/#"
REPORTED_FILTER = "$iothub/twin/PATCH/properties/reported/#"
DESIRED_PATCH = "$iothub/twin/PATCH/properties/desired/?$version={}"
RESPONSE = "$iothub/twin/res/{}/?$rid={}"


class CloudTwinService(PahoSubscriber):
    """One twin served on ``host:port``; ``desired`` starts as given (its ``$version`` as given, else 1)."""

    def __init__(
        self, *, host: str, port: int, desired: dict[str, Any] | None = None, client_id: str = "cloud-twin-service"
    ) -> None:
        super().__init__(
            host=host, port=port, client_id=client_id, subscriptions=[(GET_FILTER, 0), (REPORTED_FILTER, 1)]
        )
        self.desired: dict[str, Any] = {"$version": 1, **(desired or {})}
        self.reported: dict[str, Any] = {"$version": 1}
        self.answer_status = 200
        self.gets = 0
        self.reports = 0
        self._changed = asyncio.Event()

    def _received(self, topic: str, payload: bytes, received_at: float) -> None:
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
