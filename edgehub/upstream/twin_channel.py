"""The IoT Hub twin topics over the upstream MQTT connection: desired properties in, reported properties out.

A parent edgehub or an IoT Hub-style broker steers this hub as IoT Hub steers a device: it publishes desired
patches on ``$iothub/twin/PATCH/properties/desired/?$version=N`` (JSON, a merge patch of the desired properties),
and this hub publishes its reported properties on ``$iothub/twin/PATCH/properties/reported/?$rid=N``.

IoT Hub does not keep twin patches for a client that is away, so a patch sent while the upstream was down is
missed; as IoT Hub's device SDKs do, every connection therefore also asks for the whole twin
(``$iothub/twin/GET/?$rid=N``, empty payload; the answer on ``$iothub/twin/res/{status}/?$rid=N``, status 200 with
``{"desired": {..., "$version": V}, "reported": {...}}``, else 429 or 5xx and an error body; see
learn.microsoft.com/azure/iot/iot-mqtt-connect-to-iot-hub, "Retrieve a device twin's properties"), and puts its
desired document whole when its ``$version`` is not the one that runs.

Use: ``channel = TwinChannel()``; ``MqttUpstream.attach_twin(channel)`` (the transport hands it every connection
and every PUBLISH it ``takes``); ``channel.bind(apply, put=..., running_version=...)`` once the hub can apply
patches and documents; ``channel.report(reported)`` after every update.

Invariants:
* a patch is handed to ``apply`` once, in the order received; patches that arrive before ``bind`` are kept (at
  most ``MAX_WAITING``, the oldest dropped and logged) and applied at ``bind``, in order;
* a payload over ``max_patch_bytes``, not JSON or not a JSON object is refused (logged through the
  ``RefusalLog``) and never applied; ``$version`` from the topic is put in the patch when the body has none;
* the latest reported properties are published on every connection as it comes up (a reconnect re-reports), and
  at once when they change while connected; a publish that cannot go out now waits for the next connection;
* patches and fetched documents are applied one at a time in the order they came; a fetched document is put only
  when its ``$version`` differs from the running one (asked when its turn comes, after the patches before it) and
  from the last document this channel put, and never when it holds no desired property; an answer to a GET that
  is not 200, or that is not a twin, is logged (its body cut to ``LOGGED_BODY_BYTES``) and changes nothing; an
  answer to anything but this connection's GET is not applied (a failed answer to a reported patch is logged).
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

__all__ = [
    "DESIRED_PATCH_FILTER",
    "DESIRED_PATCH_PREFIX",
    "REPORTED_PATCH_PREFIX",
    "TWIN_GET_PREFIX",
    "TWIN_RESPONSE_FILTER",
    "TWIN_RESPONSE_PREFIX",
    "TwinChannel",
]

log = logging.getLogger(__name__)

DESIRED_PATCH_PREFIX = "$iothub/twin/PATCH/properties/desired/"
DESIRED_PATCH_FILTER = DESIRED_PATCH_PREFIX + "#"
REPORTED_PATCH_PREFIX = "$iothub/twin/PATCH/properties/reported/"
TWIN_GET_PREFIX = "$iothub/twin/GET/"
TWIN_RESPONSE_PREFIX = "$iothub/twin/res/"
TWIN_RESPONSE_FILTER = TWIN_RESPONSE_PREFIX + "#"
LOGGED_BODY_BYTES = 256  # of an error answer, in the log line
DEFAULT_MAX_PATCH_BYTES = 256 * 1024
MAX_WAITING = 16

Apply = Callable[[dict[str, object]], Awaitable[object]]
_PATCH, _DOCUMENT = "patch", "document"
_Item = tuple[str, dict[str, object]]  # (_PATCH or _DOCUMENT, the desired properties)


class Publisher(Protocol):
    """What the channel needs of a connection (``mqtt.connection.Connection``): publish, and subscribe to filters
    (each with its QoS) in one SUBSCRIBE."""

    def publish(self, topic: str, payload: bytes, qos: int) -> object: ...

    def subscribe(self, filters: list[tuple[str, int]]) -> object: ...


class TwinChannel:
    def __init__(self, *, max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES, refusals: RefusalLog | None = None) -> None:
        if max_patch_bytes < 2:
            raise ValueError("max_patch_bytes must be >= 2")
        self._max = max_patch_bytes
        self._refusals = refusals or RefusalLog(log)
        self._waiting: deque[_Item] = deque()
        self._queue: asyncio.Queue[_Item] | None = None
        self._task: asyncio.Task[None] | None = None
        self._client: Publisher | None = None
        self._reported: bytes | None = None
        self._rid = itertools.count(1)
        self._get_rid: str | None = None  # the rid of this connection's twin GET
        self._put_version: int | None = None  # of the last fetched document this channel put
        self.patches_applied = 0
        self.documents_applied = 0  # fetched desired documents put

    # -- the transport's side --------------------------------------------------------------------------------
    def connected(self, client: Publisher) -> None:
        """A connection came up: subscribe to desired patches and twin answers, ask for the whole twin (what
        changed while away), and report the latest reported properties."""
        self._client = client
        # Subscribed before the GET on the same connection: its answer is heard.
        client.subscribe([(DESIRED_PATCH_FILTER, 1), (TWIN_RESPONSE_FILTER, 0)])
        self._get_rid = str(next(self._rid))
        client.publish(f"{TWIN_GET_PREFIX}?$rid={self._get_rid}", b"", 0)
        self._send_reported()

    def disconnected(self) -> None:
        self._client = None
        self._get_rid = None

    @staticmethod
    def takes(topic: str) -> bool:
        """Whether a PUBLISH on ``topic`` is for this channel (a desired-properties patch or a twin answer)."""
        return topic.startswith((DESIRED_PATCH_PREFIX, TWIN_RESPONSE_PREFIX))

    def received(self, topic: str, payload: bytes) -> None:
        """A PUBLISH on ``topic`` (called on the event loop)."""
        if topic.startswith(TWIN_RESPONSE_PREFIX):
            document = self._answer(topic, payload)
            if document is not None:
                self._enqueue((_DOCUMENT, document))
            return
        if not topic.startswith(DESIRED_PATCH_PREFIX):
            return
        patch = self._parse(topic, payload)
        if patch is not None:
            self._enqueue((_PATCH, patch))

    def _enqueue(self, item: _Item) -> None:
        if self._queue is None:
            if len(self._waiting) >= MAX_WAITING:
                self._waiting.popleft()
                log.warning("upstream.twin_patch_dropped reason=too_many_before_start kept=%d", MAX_WAITING)
            self._waiting.append(item)
            return
        self._queue.put_nowait(item)

    # -- the hub's side ----------------------------------------------------------------------------------------
    def bind(
        self,
        apply: Apply,
        *,
        put: Apply | None = None,
        running_version: Callable[[], int | None] = lambda: None,
    ) -> None:
        """Apply patches with ``apply`` and fetched desired documents with ``put`` (None: fetched documents are
        not applied) from now on, the ones that waited first, in order. ``running_version`` tells the
        ``$version`` of the desired properties that run (the controller's)."""
        self._queue = asyncio.Queue()
        while self._waiting:
            self._queue.put_nowait(self._waiting.popleft())
        self._task = asyncio.create_task(
            self._run(self._queue, apply, put, running_version), name="upstream.twin_patches"
        )

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
    async def _run(
        self,
        queue: asyncio.Queue[_Item],
        apply: Apply,
        put: Apply | None,
        running_version: Callable[[], int | None],
    ) -> None:
        while True:
            kind, desired = await queue.get()
            if kind == _DOCUMENT:
                await self._put_document(desired, put, running_version())
                continue
            try:
                await apply(desired)  # answers with its status and reports it: a refusal is no error here
            except Exception as exc:
                log.warning("upstream.twin_patch_failed error=%r", exc)
                continue
            self.patches_applied += 1

    async def _put_document(self, desired: dict[str, object], put: Apply | None, running: int | None) -> None:
        version = desired.get("$version")
        if put is None or version == running or version == self._put_version:
            log.info("upstream.twin_desired_current version=%s running=%s", version, running)
            return
        if not any(not key.startswith("$") for key in desired):
            # A twin nobody set desired properties on: putting it would refuse (no routes) on every connection.
            log.info("upstream.twin_desired_empty version=%s", version)
            return
        self._put_version = version if isinstance(version, int) else None
        log.info("upstream.twin_desired_fetched version=%s running=%s", version, running)
        try:
            await put(desired)  # answers with its status and reports it, as a patch does
        except Exception as exc:
            log.warning("upstream.twin_document_failed error=%r", exc)
            return
        self.documents_applied += 1

    def _answer(self, topic: str, payload: bytes) -> dict[str, object] | None:
        """The desired properties of an answer to this connection's GET; None (and logged) for anything else."""
        status, _, query = topic[len(TWIN_RESPONSE_PREFIX) :].partition("/")
        rid = (parse_qs(query.lstrip("?")).get("$rid") or [""])[0]
        ours = rid != "" and rid == self._get_rid
        if not status.isdigit() or len(status) > 3 or not 200 <= int(status) < 300:
            body = payload[:LOGGED_BODY_BYTES].decode("utf-8", errors="replace")
            log.warning("upstream.twin_answer_failed status=%s rid=%s get=%s body=%r", status[:8], rid[:16], ours, body)
            return None
        if not ours or status != "200":
            return None  # the answer to a reported patch (204), or to a GET of an earlier connection
        self._get_rid = None  # one document per GET
        if len(payload) > self._max:
            self._refuse(RefusalReason.TWIN_TOO_LARGE, f"twin of {len(payload)} bytes, over {self._max}")
            return None
        try:
            twin: Any = json.loads(payload)
        except (ValueError, RecursionError) as exc:
            self._refuse(RefusalReason.TWIN_INVALID, f"twin not JSON: {exc}")
            return None
        desired = twin.get("desired") if isinstance(twin, dict) else None
        if not isinstance(desired, dict):
            self._refuse(RefusalReason.TWIN_INVALID, "twin without a desired object")
            return None
        desired.pop("$metadata", None)  # IoT Hub's bookkeeping, not a desired property
        return desired

    def _send_reported(self) -> None:
        if self._client is None or self._reported is None:
            return
        topic = f"{REPORTED_PATCH_PREFIX}?$rid={next(self._rid)}"
        self._client.publish(topic, self._reported, 1)

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
