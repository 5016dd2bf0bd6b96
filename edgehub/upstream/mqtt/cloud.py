"""The MQTT upstream's cloud side: messages for the devices behind the hub, and direct method calls, from the
broker or parent hub the upstream is connected to, handed to the hub (``edgehub.core.methods.CloudCommands``).

Topics (one upstream connection serves every identity behind the hub, so each topic names its target):
* ``devices/{d}/messages/devicebound/{bag}``: a cloud-to-device message for device ``d``, its properties in the
  IoT Hub property bag (``edgehub.core.property_bag``; on MQTT 5 user properties too, content type and
  correlation data). Subscribed at QoS 1 for each device the hub knows (``CloudCommands.device_ids``, at most
  ``max_devices``), when each connection is made, as a child hub subscribes for the devices behind it.
* ``$iothub/{d}/methods/POST/{name}/?$rid={rid}[&$timeout={s}]`` (a device) and
  ``$iothub/{d}/{m}/methods/POST/{name}/?$rid=...`` (a module): a direct method call, the identity in the topic
  (``edgehub.core.methods.parse_addressed_call``); ``$timeout`` in seconds, 30 when absent. Its answer goes
  out on ``$iothub/{d}[/{m}]/methods/res/{status}/?$rid={rid}`` with the target's payload, or IoT Hub's error.
  A call without a ``$rid`` cannot be answered: it is logged and dropped.

Invariants:
* a device-bound message is acknowledged (our PUBACK, sent when the hub says) only once the hub has it durably, or has
  refused it for good (unknown device, queue full, too large: the refusal is logged by the hub); a store failure
  leaves it unacknowledged, so the broker sends it again on the next connection;
* method calls in progress are bounded (``max_calls``); one over it is answered 429 at once;
* nothing a broker sends raises here: an unknown topic or a malformed one is logged (rate-limited) and acked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from edgehub.core import Clock, EdgeHubError, IngestRejected, Message, StoreError, SystemProperty
from edgehub.core.logtext import shown
from edgehub.core.methods import (
    AddressedCall,
    CloudCommands,
    MethodCall,
    MethodErrorCode,
    method_error,
    parse_addressed_call,
)
from edgehub.core.property_bag import BAG_KEYS
from edgehub.core.refusals import RateLimitedLog, RefusalLog, RefusalReason

__all__ = ["CloudMessage", "CloudSide", "subscriptions"]

log = logging.getLogger(__name__)

_SEG = r"([^/#+$][^/#+]*)"
_DEVICEBOUND = re.compile(rf"^devices/{_SEG}/messages/devicebound(?:/(.*))?$")
_SUBSCRIBE_CHUNK = 100  # filters per SUBSCRIBE packet


@dataclass(frozen=True, slots=True)
class CloudMessage:
    """A PUBLISH from the broker, as the connection hands it over (plain values)."""

    topic: str
    payload: bytes
    qos: int
    mid: int
    user_properties: Sequence[tuple[str, str]] = ()
    content_type: str | None = None
    correlation_data: bytes | None = None


def subscriptions(device_ids: Sequence[str]) -> list[tuple[str, int]]:
    """The filters (and QoS) the upstream subscribes to for these devices."""
    out: list[tuple[str, int]] = []
    for d in device_ids:
        if not d or any(c in d for c in "/#+"):
            continue  # not a topic level; Identity forbids '/' already, a wildcard would widen the filter
        out += [(f"devices/{d}/messages/devicebound/#", 1), (f"$iothub/{d}/methods/POST/#", 0)]
        out.append((f"$iothub/{d}/+/methods/POST/#", 0))
    return out


def _message(m: CloudMessage, bag: str) -> Message:
    system: dict[str, str] = {}
    app: dict[str, str | None] = {}
    pairs: list[tuple[str, str | None]] = []
    for part in bag.split("&") if bag else ():
        if part:
            key, sep, raw = part.partition("=")
            pairs.append((unquote(key), unquote(raw) if sep else None))
    pairs.extend(m.user_properties)
    for key, value in pairs:
        sp = BAG_KEYS.get(key)
        if sp is None:
            app[key] = value
        elif sp not in (SystemProperty.CONNECTION_DEVICE_ID, SystemProperty.CONNECTION_MODULE_ID):
            system[sp.value] = value or ""  # the connection's properties are the hub's to set, never the cloud's
    if m.content_type is not None:
        system[SystemProperty.CONTENT_TYPE.value] = m.content_type
    if m.correlation_data is not None:
        system[SystemProperty.CORRELATION_ID.value] = m.correlation_data.decode("utf-8", errors="replace")
    return Message(m.payload, app, system)


class CloudSide:
    """Turns the broker's PUBLISHes into the hub's calls. ``publish(topic, payload)`` sends on the current
    connection (QoS 0); ``handle`` runs on the loop, with the ack of the connection the PUBLISH came on."""

    def __init__(
        self,
        commands: CloudCommands,
        *,
        publish: Callable[[str, bytes], None],
        refusals: RefusalLog,
        clock: Clock,
        max_calls: int = 256,
    ) -> None:
        if max_calls < 1:
            raise ValueError("max_calls must be positive")
        self.commands = commands
        self._publish = publish
        self._clock = clock
        self._refusals = refusals
        self._events = RateLimitedLog(log, clock=clock)  # the cloud decides how many: a few lines per device
        self._max_calls = max_calls
        self._tasks: set[asyncio.Task[None]] = set()
        self._calls = 0

    def handle(self, m: CloudMessage, ack: Callable[[], None]) -> None:
        """One PUBLISH; ``ack`` sends its PUBACK (a no-op for QoS 0) on the connection it came on."""
        match = _DEVICEBOUND.match(m.topic)
        if match is not None:
            self._spawn(self._c2d(m, ack, match.group(1), match.group(2) or ""), f"upstream.c2d {match.group(1)}")
            return
        ack()  # a call is live or it fails: nothing to keep, nothing to send again
        call = parse_addressed_call(m.topic)
        if call is not None:
            self._method(m, call)
            return
        self._refusals.refused(RefusalReason.TOPIC_INVALID, peer="$upstream", topic=shown(m.topic))

    def _spawn(self, coro: Coroutine[None, None, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _c2d(self, m: CloudMessage, ack: Callable[[], None], device_id: str, bag: str) -> None:
        try:
            await self.commands.cloud_to_device(device_id, _message(m, bag.rstrip("/")))
        except IngestRejected:
            pass  # refused for good, and logged by the hub: acked, so the broker does not send it again
        except StoreError as exc:
            self._events.warning(device_id, "upstream.c2d_not_stored", device=device_id, detail=exc)
            return  # not acked: the broker sends it again on the next connection
        except EdgeHubError as exc:
            self._events.warning(device_id, "upstream.c2d_failed", device=device_id, detail=exc)
        ack()

    def _method(self, m: CloudMessage, call: AddressedCall) -> None:
        if call.timeout_s is None:
            self._answer(call, MethodErrorCode.BAD_FORMAT, RefusalReason.METHOD_INVALID, "$timeout is not a number")
        elif self._calls >= self._max_calls:
            why = f"{self._calls} calls in progress"
            self._answer(call, MethodErrorCode.THROTTLED, RefusalReason.TOO_MANY_CALLS, why)
        else:
            self._calls += 1
            method = MethodCall(call.name, m.payload, call.timeout_s)
            self._spawn(self._invoke(call, method), f"upstream.method {call.target}")

    async def _invoke(self, call: AddressedCall, method: MethodCall) -> None:
        try:
            result = await self.commands.invoke_method("$upstream", call.target, method)
        finally:
            self._calls -= 1
        self._publish(call.response_topic(result.status), result.payload)

    def _answer(self, call: AddressedCall, code: MethodErrorCode, reason: RefusalReason, why: str) -> None:
        self._refusals.refused(reason, peer="$upstream", rid=call.rid, why=json.dumps(why))
        result = method_error(code, detail=why, now_s=self._clock.time())
        self._publish(call.response_topic(result.status), result.payload)

    async def close(self) -> None:
        """Cancel what is in progress (an unacknowledged device-bound message comes again from the broker)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
