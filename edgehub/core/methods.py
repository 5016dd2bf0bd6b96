"""Direct methods and cloud-to-device messages as values every layer shares: a call, its result, IoT Hub's limits
and error bodies, and ``CloudCommands``, what the hub offers the upstream (the cloud's side of both).

IoT Hub's rules, kept here in one place (https://learn.microsoft.com/azure/iot-hub/iot-hub-devguide-direct-methods):
* a method call waits ``responseTimeoutInSeconds`` for its answer, 5 to 300 s, 30 by default;
* request and response payloads are JSON documents of at most 128 KB;
* a target that is not connected is answered 404 (error code 404103, DeviceNotOnline), one that does not answer
  in time 504 (504101, GatewayTimeout); the body of such an answer is a JSON error with IoT Hub's fields
  (``error_payload``).
  A target whose connection closes while the call waits is answered 404 (404104, DeviceConnectionClosedRemotely);
  a call the hub refuses for its bounds 429 (429002, throttled) and a malformed one 400 (400004, bad format).

Addressed calls (``parse_addressed_call``): where one connection speaks for many identities (the upstream's, or a
module's calling others), ``$iothub/{d}[/{m}]/methods/POST/{name}/?$rid={rid}[&$timeout={s}]`` names the target,
and the answer goes to ``$iothub/{d}[/{m}]/methods/res/{status}/?$rid={rid}``.

Methods are never stored: a call is live or it fails. Standard library only, like all of ``edgehub.core``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from typing import Protocol
from urllib.parse import parse_qsl, unquote

from edgehub.core.identity import Identity
from edgehub.core.message import Message

__all__ = [
    "DEFAULT_METHOD_TIMEOUT_S",
    "MAX_METHOD_NAME_LENGTH",
    "MAX_METHOD_PAYLOAD_BYTES",
    "MAX_METHOD_TIMEOUT_S",
    "MAX_RID_LENGTH",
    "MAX_TARGET_ID_LENGTH",
    "MIN_METHOD_TIMEOUT_S",
    "AddressedCall",
    "CloudCommands",
    "MethodCall",
    "MethodErrorCode",
    "MethodResult",
    "error_payload",
    "method_error",
    "method_name_problem",
    "parse_addressed_call",
    "parse_addressed_response",
]

DEFAULT_METHOD_TIMEOUT_S = 30.0
MIN_METHOD_TIMEOUT_S = 5.0
MAX_METHOD_TIMEOUT_S = 300.0
MAX_METHOD_PAYLOAD_BYTES = 128 * 1024
MAX_METHOD_NAME_LENGTH = 128  # a name travels in a topic level; IoT Hub gives no figure, a topic must stay short
# IoT Hub's own limits on a device id and a module id, and this hub's on a request id: an addressed call's answer
# topic is made of them (``AddressedCall.response_topic``), so with them it stays far under MQTT's 65,535 bytes
# (at most 8 + 4 x 128 + 1 + 4 x 128 + 13 + 6 + 7 + 4 x 128 = 1,571), whatever the call's own topic was.
MAX_TARGET_ID_LENGTH = 128
MAX_RID_LENGTH = 128

# IoT Hub: method names and property values hold printable US-ASCII but these (they would break the topic or URI).
_NAME_FORBIDDEN = frozenset('$()<>@,;:\\"/[]?={} \t')


class MethodErrorCode(IntEnum):
    """IoT Hub's error codes in the body of a failed call; the status is the first three digits."""

    BAD_FORMAT = 400004
    DEVICE_NOT_ONLINE = 404103
    CONNECTION_CLOSED = 404104
    THROTTLED = 429002
    GATEWAY_TIMEOUT = 504101

    @property
    def status(self) -> int:
        return self.value // 1000


_MESSAGES = {
    MethodErrorCode.BAD_FORMAT: "The method call is not valid.",
    MethodErrorCode.DEVICE_NOT_ONLINE: "Timed out waiting for device to connect.",
    MethodErrorCode.CONNECTION_CLOSED: "The device closed its connection before it answered.",
    MethodErrorCode.THROTTLED: "Too many method calls are pending.",
    MethodErrorCode.GATEWAY_TIMEOUT: "Timed out waiting for the response from device.",
}


@dataclass(frozen=True, slots=True)
class MethodCall:
    """A direct method call: ``name``, the JSON ``payload`` as bytes, and how long to wait for the answer."""

    name: str
    payload: bytes = b""
    timeout_s: float = DEFAULT_METHOD_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class MethodResult:
    """The answer: the target's status and payload, or the hub's IoT Hub-style error (``status`` 4xx/5xx)."""

    status: int
    payload: bytes = b""


def error_payload(code: MethodErrorCode, *, detail: str = "", now_s: float) -> bytes:
    """IoT Hub's error body for ``code``: ``{"errorCode", "message", "trackingId", "timestampUtc"[, "info"]}``."""
    body: dict[str, object] = {
        "errorCode": int(code),
        "message": _MESSAGES[code],
        "trackingId": "",
        "timestampUtc": datetime.fromtimestamp(now_s, tz=UTC).isoformat().replace("+00:00", "Z"),
    }
    if detail:
        body["info"] = {"detail": detail}
    return json.dumps(body).encode()


def method_error(code: MethodErrorCode, *, detail: str = "", now_s: float) -> MethodResult:
    return MethodResult(code.status, error_payload(code, detail=detail, now_s=now_s))


def method_name_problem(name: str) -> str | None:
    """Why ``name`` is not a method name IoT Hub accepts (None: it is one)."""
    if not name or len(name) > MAX_METHOD_NAME_LENGTH:
        return f"method name must be 1 to {MAX_METHOD_NAME_LENGTH} characters"
    if not name.isascii() or not name.isprintable() or any(c in _NAME_FORBIDDEN for c in name):
        return "method name holds a character IoT Hub does not allow"
    return None


# An addressed call: one connection (the upstream's, a module's) speaks for many identities, so the topic names
# the target (this hub's form: IoT Hub has none, as it has one connection per identity). A level may not start
# with "$" (no "$iothub").
_SEG = r"([^/#+$][^/#+]*)"
_CALL = re.compile(rf"^\$iothub/{_SEG}(?:/{_SEG})?/methods/POST/([^/]+)/\?(.*)$")


@dataclass(frozen=True, slots=True)
class AddressedCall:
    """A call on an addressed topic: its target, the call (a bad ``$timeout`` is None) and the answer's topic
    prefix ``$iothub/{d}[/{m}]``."""

    target: Identity
    name: str
    rid: str
    timeout_s: float | None
    base: str

    def response_topic(self, status: int) -> str:
        """``$iothub/{d}[/{m}]/methods/res/{status}/?$rid={rid}``: where the answer goes."""
        return f"{self.base}/methods/res/{status}/?$rid={self.rid}"


def parse_addressed_call(topic: str) -> AddressedCall | None:
    """The call a ``$iothub/{d}[/{m}]/methods/POST/{name}/?$rid=...`` topic makes; None for any other topic, or one
    without a ``$rid`` (or one over ``MAX_RID_LENGTH``) or with a target that is no identity (or an id over
    ``MAX_TARGET_ID_LENGTH``)."""
    m = _CALL.match(topic)
    if m is None:
        return None
    device, module, name, query = m.groups()
    params = dict(parse_qsl(query, keep_blank_values=True))
    rid = params.get("$rid", "")
    if len(device) > MAX_TARGET_ID_LENGTH or (module and len(module) > MAX_TARGET_ID_LENGTH):
        return None  # no such identity in IoT Hub, and its answer's topic could pass MQTT's limit
    try:
        target = Identity.parse(f"{device}/{module}" if module else device)
    except ValueError:
        return None
    if not rid or len(rid) > MAX_RID_LENGTH:
        return None
    timeout_s: float | None
    try:
        timeout_s = float(params.get("$timeout") or DEFAULT_METHOD_TIMEOUT_S)
    except ValueError:
        timeout_s = None
    base = f"$iothub/{device}/{module}" if module else f"$iothub/{device}"
    return AddressedCall(target, unquote(name), rid, timeout_s, base)


_RESPONSE = re.compile(rf"^\$iothub/{_SEG}(?:/{_SEG})?/methods/res/(\d{{1,6}})/\?(.*)$")


def parse_addressed_response(topic: str) -> tuple[Identity, int, str] | None:
    """``(target, status, rid)`` of ``$iothub/{d}[/{m}]/methods/res/{status}/?$rid={rid}`` (an answer a child hub
    relays for an identity behind it); None for any other topic."""
    m = _RESPONSE.match(topic)
    if m is None:
        return None
    device, module, status, query = m.groups()
    rid = dict(parse_qsl(query, keep_blank_values=True)).get("$rid", "")
    if not rid or len(rid) > MAX_RID_LENGTH:
        return None
    if len(device) > MAX_TARGET_ID_LENGTH or (module and len(module) > MAX_TARGET_ID_LENGTH):
        return None
    try:
        target = Identity.parse(f"{device}/{module}" if module else device)
    except ValueError:
        return None
    return target, int(status), rid


class CloudCommands(Protocol):
    """What the hub offers the upstream: the cloud's messages for devices, and its method calls.

    The upstream (a transport: it may not import the hub) turns its wire's topics into these calls."""

    def device_ids(self) -> Sequence[str]:
        """The devices this hub serves (its own modules' device included), for the upstream to subscribe for."""
        ...

    async def cloud_to_device(self, device_id: str, message: Message) -> None:
        """Store ``message`` durably for ``device_id``; return when it is. Raises ``IngestRejected`` (unknown
        device, queue full, too large) and ``StoreError``."""
        ...

    async def invoke_method(self, caller: str, target: Identity, call: MethodCall) -> MethodResult:
        """Deliver ``call`` to the connected ``target`` and wait for its answer (or IoT Hub's 4xx/5xx). Never
        raises for anything the caller sent."""
        ...
