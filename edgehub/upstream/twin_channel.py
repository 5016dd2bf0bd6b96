"""The IoT Hub twin topics over the upstream MQTT connection: desired-property patches in, reported properties out.

A parent edgehub or an IoT Hub-style broker steers this hub as IoT Hub steers a device: it publishes desired
patches on ``$iothub/twin/PATCH/properties/desired/?$version=N`` (JSON, a merge patch of the desired properties),
and this hub publishes its reported properties on ``$iothub/twin/PATCH/properties/reported/?$rid=N``.

Use: ``channel = TwinChannel()``; ``MqttUpstream.attach_twin(channel)`` (the transport subscribes on every
connection and hands each PUBLISH to ``received``); ``channel.bind(apply)`` once the hub can apply patches;
``channel.report(reported)`` after every update.

Invariants:
* a patch is handed to ``apply`` once, in the order received; patches that arrive before ``bind`` are kept (at
  most ``MAX_WAITING``, the oldest dropped and logged) and applied at ``bind``, in order;
* a payload over ``max_patch_bytes``, not JSON or not a JSON object is refused (logged through the
  ``RefusalLog``) and never applied; ``$version`` from the topic is put in the patch when the body has none;
* the latest reported properties are published on every connection as it comes up (a reconnect re-reports), and
  at once when they change while connected; a publish that cannot go out now waits for the next connection.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import parse_qs

from edgehub.core.refusals import RefusalLog, RefusalReason

__all__ = ["DESIRED_PATCH_FILTER", "DESIRED_PATCH_PREFIX", "REPORTED_PATCH_PREFIX", "TwinChannel"]

log = logging.getLogger(__name__)

DESIRED_PATCH_PREFIX = "$iothub/twin/PATCH/properties/desired/"
DESIRED_PATCH_FILTER = DESIRED_PATCH_PREFIX + "#"
REPORTED_PATCH_PREFIX = "$iothub/twin/PATCH/properties/reported/"
DEFAULT_MAX_PATCH_BYTES = 256 * 1024
MAX_WAITING = 16

Apply = Callable[[dict[str, object]], Awaitable[object]]


class Publisher(Protocol):
    """What the channel needs of a connection: QoS 1 publish and subscribe (paho's client has both)."""

    def publish(self, topic: str, payload: bytes, qos: int) -> object: ...

    def subscribe(self, topic: str, qos: int) -> object: ...


class TwinChannel:
    def __init__(self, *, max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES, refusals: RefusalLog | None = None) -> None:
        if max_patch_bytes < 2:
            raise ValueError("max_patch_bytes must be >= 2")
        self._max = max_patch_bytes
        self._refusals = refusals or RefusalLog(log)
        self._waiting: deque[dict[str, object]] = deque()
        self._queue: asyncio.Queue[dict[str, object]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._client: Publisher | None = None
        self._reported: bytes | None = None
        self._rid = itertools.count(1)
        self.patches_applied = 0
        self.reports_sent = 0

    # -- the transport's side --------------------------------------------------------------------------------
    def connected(self, client: Publisher) -> None:
        """A connection came up: subscribe to desired patches and report the latest reported properties."""
        self._client = client
        client.subscribe(DESIRED_PATCH_FILTER, 1)
        self._send_reported()

    def disconnected(self) -> None:
        self._client = None

    @staticmethod
    def takes(topic: str) -> bool:
        """Whether a PUBLISH on ``topic`` is for this channel (a desired-properties patch)."""
        return topic.startswith(DESIRED_PATCH_PREFIX)

    def received(self, topic: str, payload: bytes) -> None:
        """A PUBLISH on ``topic`` (called on the event loop)."""
        if not self.takes(topic):
            return
        patch = self._parse(topic, payload)
        if patch is None:
            return
        if self._queue is None:
            if len(self._waiting) >= MAX_WAITING:
                self._waiting.popleft()
                log.warning("upstream.twin_patch_dropped reason=too_many_before_start kept=%d", MAX_WAITING)
            self._waiting.append(patch)
            return
        self._queue.put_nowait(patch)

    # -- the hub's side ----------------------------------------------------------------------------------------
    def bind(self, apply: Apply) -> None:
        """Apply patches with ``apply`` from now on (the ones that waited first, in order)."""
        self._queue = asyncio.Queue()
        while self._waiting:
            self._queue.put_nowait(self._waiting.popleft())
        self._task = asyncio.create_task(self._run(self._queue, apply), name="upstream.twin_patches")

    def report(self, reported: dict[str, object]) -> None:
        """Publish ``reported`` now if connected, and on every connection from now on."""
        self._reported = json.dumps(reported, separators=(",", ":"), default=str).encode("utf-8")
        self._send_reported()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- inside --------------------------------------------------------------------------------------------------
    async def _run(self, queue: asyncio.Queue[dict[str, object]], apply: Apply) -> None:
        while True:
            patch = await queue.get()
            try:
                await apply(patch)  # answers with its status and reports it: a refusal is no error here
            except Exception as exc:
                log.warning("upstream.twin_patch_failed error=%r", exc)
                continue
            self.patches_applied += 1

    def _send_reported(self) -> None:
        if self._client is None or self._reported is None:
            return
        topic = f"{REPORTED_PATCH_PREFIX}?$rid={next(self._rid)}"
        self._client.publish(topic, self._reported, 1)
        self.reports_sent += 1

    def _parse(self, topic: str, payload: bytes) -> dict[str, object] | None:
        if len(payload) > self._max:
            self._refuse(RefusalReason.TWIN_TOO_LARGE, f"{len(payload)} bytes, over {self._max}")
            return None
        try:
            patch: Any = json.loads(payload)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            self._refuse(RefusalReason.TWIN_INVALID, f"not JSON: {exc}")
            return None
        if not isinstance(patch, dict):
            self._refuse(RefusalReason.TWIN_INVALID, "not a JSON object")
            return None
        version = _topic_version(topic)
        if version is not None and "$version" not in patch:
            patch["$version"] = version
        return patch

    def _refuse(self, reason: RefusalReason, detail: str) -> None:
        self._refusals.refused(reason, peer="upstream", client="upstream", topic="desired", detail=detail)


def _topic_version(topic: str) -> int | None:
    query = topic[len(DESIRED_PATCH_PREFIX) :].lstrip("?")
    values = parse_qs(query).get("$version")
    if not values or not values[0].isascii() or not values[0].isdigit() or len(values[0]) > 18:
        return None
    return int(values[0])
