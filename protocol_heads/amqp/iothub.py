"""Azure IoT Hub's (and Azure IoT Edge hub's) AMQP conventions as pure functions: link addresses, SASL
usernames, ``$cbs`` put-token requests and answers, and the mapping of AMQP message fields to the hub's system
properties, so that a route sees the same message whichever protocol sent it.

* Link addresses (leading ``/`` optional, matched without case as IoT Hub does): a client sends telemetry to
  ``/devices/{d}/messages/events`` or, a module its outputs, to ``/devices/{d}/modules/{m}/messages/events``; a
  module receives its inputs from ``/devices/{d}/modules/{m}/messages/events`` (as Edge hub's module link does;
  ``.../inputs`` too), a device its device-bound messages from ``/devices/{d}/messages/devicebound``. The twin
  is a pair of links (one each way) on ``/devices/{d}/twin`` or ``/devices/{d}/modules/{m}/twin``, direct
  methods a pair on ``/devices/{d}/methods/devicebound`` or ``/devices/{d}/modules/{m}/methods/devicebound``
  (what travels on them: ``twin_methods.py``).
* SASL PLAIN username: ``{d}@sas.{hub}``, ``{d}/{m}@sas.{hub}`` or ``{d}/modules/{m}@sas.{hub}``, or the identity
  itself (a plain password login); the password is a SAS token or the password.
* ``$cbs``: a message with application properties ``operation=put-token``, ``type`` ending in ``:sastoken`` and
  ``name`` the audience (``{hub}/devices/{d}[/modules/{m}]``), the token as body; answered with
  ``status-code``/``status-description`` and the request's message id as correlation id.
* Fields (the system properties' names are ``SystemProperty``'s, as in MQTT's property bag,
  ``edgehub/core/property_bag.py``): ``properties.message-id`` → messageId, ``correlation-id`` → cid,
  ``content-type``/``content-encoding``, ``to``, ``user-id`` (UTF-8) → userId, ``absolute-expiry-time`` and
  ``creation-time`` (ISO 8601, as MQTT's ``$.exp``/``$.ctime`` carry them), ``group-id`` → sessionId, message
  annotation ``x-opt-partition-key`` → partitionKey; application properties ``iothub-message-schema``,
  ``iothub-creation-time-utc``, ``iothub-operation``, ``iothub-outputname`` are system properties (Edge hub's
  names), annotations ``iothub-outputname``, ``iothub-interface-id`` and ``dt-subject`` too; every other
  application property stays one (values as text; null stays null). A module input goes out with the
  ``x-opt-input-name`` annotation and the sender's ``iothub-connection-device-id``/``-module-id``.
* The connection's own properties (``connectionDeviceId``, ``connectionModuleId``, ``connectionAuthMethod``) come
  from the authenticated identity, never from the client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from urllib.parse import unquote

from proton import Message as AmqpMessage
from proton import symbol

from edgehub.core import DeviceId, Identity, InvalidMessageError, Message, ModuleId, SystemProperty

__all__ = [
    "CBS_NODE",
    "Address",
    "AddressKind",
    "CbsRequest",
    "MessageFields",
    "amqp_from_message",
    "cbs_response",
    "identity_of_audience",
    "message_from_amqp",
    "parse_address",
    "parse_cbs_request",
    "parse_plain_username",
]

CBS_NODE = "$cbs"
INPUT_NAME_ANNOTATION = symbol("x-opt-input-name")
PARTITION_KEY_ANNOTATION = symbol("x-opt-partition-key")
DEVICE_ID_ANNOTATION = symbol("iothub-connection-device-id")
MODULE_ID_ANNOTATION = symbol("iothub-connection-module-id")

# Application properties that are system properties (Edge hub's AmqpMessageConverter names).
_APP_SYSTEM: Mapping[str, str] = {
    "iothub-message-schema": SystemProperty.MESSAGE_SCHEMA.value,
    "iothub-creation-time-utc": SystemProperty.CREATION_TIME.value,
    "iothub-operation": SystemProperty.OPERATION.value,
    "iothub-outputname": SystemProperty.OUTPUT_NAME.value,
}
_APP_KEY_OF: Mapping[str, str] = {v: k for k, v in _APP_SYSTEM.items() if k != "iothub-outputname"}
# Message annotations that are system properties.
_ANNOTATION_SYSTEM: Mapping[str, str] = {
    "iothub-outputname": SystemProperty.OUTPUT_NAME.value,
    "iothub-interface-id": SystemProperty.INTERFACE_ID.value,
    "dt-subject": SystemProperty.DT_SUBJECT.value,
    "x-opt-partition-key": SystemProperty.PARTITION_KEY.value,
}
_CONNECTION_OWNED = (
    SystemProperty.CONNECTION_DEVICE_ID.value,
    SystemProperty.CONNECTION_MODULE_ID.value,
    SystemProperty.CONNECTION_AUTH_METHOD.value,
)
_MAX_PROPERTY_TEXT = 64 * 1024  # a property's value, as text: the message-size bound applies on top


class AddressKind(StrEnum):
    TELEMETRY = "telemetry"  # the client sends: device telemetry or module output
    MODULE_INPUTS = "module_inputs"  # the hub sends a module its inputs
    DEVICE_BOUND = "device_bound"  # the hub sends a device its device-bound messages
    CBS = "cbs"
    TWIN = "twin"  # either way: requests in, answers and desired-property patches out
    METHODS = "methods"  # either way: calls out, answers in


@dataclass(frozen=True, slots=True)
class Address:
    kind: AddressKind
    identity: Identity | None = None


_SEG = r"([^/]+)"
_DEVICE_EVENTS = re.compile(rf"^/?devices/{_SEG}/messages/events/?$", re.IGNORECASE)
_MODULE_EVENTS = re.compile(rf"^/?devices/{_SEG}/modules/{_SEG}/messages/events/?$", re.IGNORECASE)
_MODULE_INPUTS = re.compile(rf"^/?devices/{_SEG}/modules/{_SEG}/inputs/?$", re.IGNORECASE)
_DEVICE_BOUND = re.compile(rf"^/?devices/{_SEG}/messages/devicebound/?$", re.IGNORECASE)
_DEVICE_TWIN = re.compile(rf"^/?devices/{_SEG}/twin/?$", re.IGNORECASE)
_MODULE_TWIN = re.compile(rf"^/?devices/{_SEG}/modules/{_SEG}/twin/?$", re.IGNORECASE)
_DEVICE_METHODS = re.compile(rf"^/?devices/{_SEG}/methods/devicebound/?$", re.IGNORECASE)
_MODULE_METHODS = re.compile(rf"^/?devices/{_SEG}/modules/{_SEG}/methods/devicebound/?$", re.IGNORECASE)
_AUDIENCE = re.compile(rf"^(?:[a-z]+://)?{_SEG}/devices/{_SEG}(?:/modules/{_SEG})?/?$", re.IGNORECASE)
_MAX_ADDRESS = 1024


def _identity(device: str, module: str | None = None) -> Identity:
    # Each segment on its own: "a%2Fb" as a device must not become device a, module b (Identity refuses "/").
    return Identity(DeviceId(unquote(device)), ModuleId(unquote(module)) if module is not None else None)


def parse_address(address: str, *, outgoing: bool) -> Address | None:
    """What a link's address is (``outgoing``: the hub sends on the link); None for one the hub does not serve."""
    if len(address) > _MAX_ADDRESS:
        return None
    if address == CBS_NODE:
        return Address(AddressKind.CBS)
    try:
        m = _MODULE_EVENTS.match(address)
        if m is not None:
            kind = AddressKind.MODULE_INPUTS if outgoing else AddressKind.TELEMETRY
            return Address(kind, _identity(m.group(1), m.group(2)))
        m = _DEVICE_EVENTS.match(address)
        if m is not None and not outgoing:
            return Address(AddressKind.TELEMETRY, _identity(m.group(1)))
        m = _MODULE_INPUTS.match(address)
        if m is not None and outgoing:
            return Address(AddressKind.MODULE_INPUTS, _identity(m.group(1), m.group(2)))
        m = _DEVICE_BOUND.match(address)
        if m is not None and outgoing:
            return Address(AddressKind.DEVICE_BOUND, _identity(m.group(1)))
        for kind, device, module in (
            (AddressKind.TWIN, _DEVICE_TWIN, _MODULE_TWIN),
            (AddressKind.METHODS, _DEVICE_METHODS, _MODULE_METHODS),
        ):
            m = module.match(address)
            if m is not None:
                return Address(kind, _identity(m.group(1), m.group(2)))
            m = device.match(address)
            if m is not None:
                return Address(kind, _identity(m.group(1)))
    except ValueError:  # an id that is no identity (a "/" after unquoting, empty)
        return None
    return None


def parse_plain_username(username: str) -> Identity:
    """The identity a SASL PLAIN username names (module docstring); raises ValueError for anything else."""
    name, at, rest = username.partition("@")
    if at and not rest.lower().startswith("sas."):
        raise ValueError(f"username {username[:64]!r} is not identity@sas.hub")
    parts = name.split("/")
    if len(parts) == 3 and parts[1] == "modules":
        parts = [parts[0], parts[2]]
    if len(parts) not in (1, 2) or not all(parts):
        raise ValueError(f"username {username[:64]!r} does not name a device or module")
    return Identity.parse("/".join(parts))


def identity_of_audience(audience: str) -> Identity:
    """The identity of a CBS audience or SAS resource, ``[scheme://]{hub}/devices/{d}[/modules/{m}]``; raises
    ValueError for anything else."""
    m = _AUDIENCE.match(unquote(audience)) if len(audience) <= _MAX_ADDRESS else None
    if m is None:
        raise ValueError("audience is not {hub}/devices/{d}[/modules/{m}]")
    return _identity(m.group(2), m.group(3))


@dataclass(frozen=True, slots=True)
class CbsRequest:
    """A ``put-token`` on ``$cbs``; ``message_id`` is what the answer's correlation id must be."""

    audience: str
    token: str
    message_id: object
    reply_to: str | None


def parse_cbs_request(message: AmqpMessage) -> CbsRequest:
    """Raises ValueError for anything but a SAS ``put-token``."""
    props = message.properties or {}
    if props.get("operation") != "put-token":
        raise ValueError("only put-token is served on $cbs")
    kind = props.get("type")
    if not isinstance(kind, str) or not kind.endswith(":sastoken"):
        raise ValueError("only SAS tokens are served on $cbs")
    audience = props.get("name")
    token = message.body
    if isinstance(token, bytes | memoryview):
        token = bytes(token).decode("utf-8", errors="replace")
    if not isinstance(audience, str) or not isinstance(token, str):
        raise ValueError("put-token needs a name and a token")
    return CbsRequest(audience, token, message.id, message.reply_to)


def cbs_response(request_id: object, status: int, description: str, reply_to: str | None = None) -> AmqpMessage:
    answer = AmqpMessage(correlation_id=request_id, address=reply_to)
    answer.properties = {"status-code": status, "status-description": description}
    return answer


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).isoformat().replace("+00:00", "Z")


def _epoch(iso: str) -> float | None:
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _text(value: Any, what: str) -> str:
    if isinstance(value, bytes | memoryview):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidMessageError(f"{what} is not UTF-8 text") from exc
    elif isinstance(value, str):
        # proton hands symbols (content-type) as a str subclass, which the store's encoder refuses: plain str.
        text = value if type(value) is str else str.__str__(value)
    elif isinstance(value, bool | int | float) or value is None:
        text = "" if value is None else str(value)
    else:
        text = str(value)
    if len(text) > _MAX_PROPERTY_TEXT:
        raise InvalidMessageError(f"{what} is over {_MAX_PROPERTY_TEXT} characters")
    return text


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs 2 us per transfer
class MessageFields:
    """What the mapping reads of an AMQP message, as proton's ``Message`` gives it (``proton_raw.fields_of``); the
    head's transfer path reads the same out of the encoded message without building one (``MessageReader``).
    ``content_type``/``content_encoding`` are None for a null (proton's ``Message`` would say symbol("None"));
    ``expiry_time``/``creation_time`` are seconds, 0 for none."""

    body: Any
    properties: Mapping[Any, Any] | None
    annotations: Mapping[Any, Any] | None
    id: Any
    correlation_id: Any
    content_type: str | None
    content_encoding: str | None
    address: str | None
    user_id: bytes
    group_id: str | None
    expiry_time: float
    creation_time: float


def message_from_amqp(identity: Identity, message: MessageFields, *, auth_method: str) -> Message:
    """The hub message for an AMQP message ``identity`` sent on its telemetry link (the link was checked).
    Raises ``InvalidMessageError`` for a body or property the hub cannot carry."""
    body = message.body
    if body is None:
        payload = b""
    elif isinstance(body, bytes | memoryview):
        payload = bytes(body)
    elif isinstance(body, str):
        payload = body.encode()
    else:
        raise InvalidMessageError("body is neither data nor a string value")
    system: dict[str, str] = {}
    app: dict[str, str | None] = {}
    for key, value in (message.properties or {}).items():
        name = _text(key, "an application property name")
        sp = _APP_SYSTEM.get(name)
        if sp is not None:
            system[sp] = _text(value, name)
        else:
            app[name] = None if value is None else _text(value, name)
    for key, value in (message.annotations or {}).items():
        sp = _ANNOTATION_SYSTEM.get(str(key))
        if sp is not None and value is not None:
            system[sp] = _text(value, str(key))
    if message.id is not None:
        system[SystemProperty.MESSAGE_ID.value] = _text(message.id, "message-id")
    if message.correlation_id is not None:
        system[SystemProperty.CORRELATION_ID.value] = _text(message.correlation_id, "correlation-id")
    content_type = message.content_type
    if content_type:
        system[SystemProperty.CONTENT_TYPE.value] = _text(content_type, "content-type")
    content_encoding = message.content_encoding
    if content_encoding:
        system[SystemProperty.CONTENT_ENCODING.value] = _text(content_encoding, "content-encoding")
    if message.address:
        system[SystemProperty.TO.value] = _text(message.address, "to")
    if message.user_id:
        system[SystemProperty.USER_ID.value] = _text(message.user_id, "user-id")
    if message.group_id:
        system[SystemProperty.SESSION_ID.value] = _text(message.group_id, "group-id")
    if message.expiry_time:
        system[SystemProperty.ABSOLUTE_EXPIRY_TIME.value] = _iso(float(message.expiry_time))
    if message.creation_time and SystemProperty.CREATION_TIME.value not in system:
        system[SystemProperty.CREATION_TIME.value] = _iso(float(message.creation_time))
    for owned in _CONNECTION_OWNED:
        system.pop(owned, None)
    if identity.module_id is None:
        system.pop(SystemProperty.OUTPUT_NAME.value, None)  # output names belong to modules
    system[SystemProperty.CONNECTION_DEVICE_ID.value] = identity.device_id
    if identity.module_id is not None:
        system[SystemProperty.CONNECTION_MODULE_ID.value] = identity.module_id
    system[SystemProperty.CONNECTION_AUTH_METHOD.value] = auth_method
    return Message(payload, app, system)


def amqp_from_message(message: Message, *, input_name: str | None, redelivery: bool = False) -> AmqpMessage:
    """The AMQP message a module (on ``input_name``) or a device (``input_name`` None) receives."""
    sp = message.system_properties
    out = AmqpMessage(body=message.body, inferred=True)
    out.id = sp.get(SystemProperty.MESSAGE_ID.value) or None
    out.correlation_id = sp.get(SystemProperty.CORRELATION_ID.value) or None
    out.content_type = sp.get(SystemProperty.CONTENT_TYPE.value) or None
    out.content_encoding = sp.get(SystemProperty.CONTENT_ENCODING.value) or None
    out.address = sp.get(SystemProperty.TO.value) or None
    user = sp.get(SystemProperty.USER_ID.value)
    if user:
        out.user_id = user.encode()
    group = sp.get(SystemProperty.SESSION_ID.value)
    if group:
        out.group_id = group
    expiry = sp.get(SystemProperty.ABSOLUTE_EXPIRY_TIME.value)
    if expiry:
        epoch = _epoch(expiry)
        if epoch is not None:
            out.expiry_time = epoch
    annotations: dict[symbol, object] = {}
    if input_name is not None:
        annotations[INPUT_NAME_ANNOTATION] = input_name
    device = sp.get(SystemProperty.CONNECTION_DEVICE_ID.value)
    if device:
        annotations[DEVICE_ID_ANNOTATION] = device
    module = sp.get(SystemProperty.CONNECTION_MODULE_ID.value)
    if module:
        annotations[MODULE_ID_ANNOTATION] = module
    for key, name in _ANNOTATION_SYSTEM.items():
        value = sp.get(name)
        if value and name != SystemProperty.OUTPUT_NAME.value:  # the output name is the sender's business
            annotations[symbol(key)] = value
    if annotations:
        out.annotations = annotations
    props: dict[str, object] = {}
    for name, key in _APP_KEY_OF.items():
        value = sp.get(name)
        if value:
            props[key] = value
    props.update(message.properties)
    if props:
        out.properties = props
    if redelivery:
        out.delivery_count = 1
        out.first_acquirer = False
    return out
