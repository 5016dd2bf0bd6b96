"""Azure IoT Hub's MQTT conventions as pure functions, so that existing device and module code connects unchanged.

* Client id ``deviceId`` or ``deviceId/moduleId``; username ``{host}/{deviceId}[/{moduleId}]/?api-version=...``.
* Telemetry: ``devices/{d}/messages/events/{bag}`` and ``devices/{d}/modules/{m}/messages/events/{bag}``;
  module inputs: ``devices/{d}/modules/{m}/inputs/{input}/{bag}``; device-bound:
  ``devices/{d}/messages/devicebound/{bag}``.
* The property bag is ``k=v&k=v`` with keys and values URL-encoded (``%20`` for space, ``+`` literal). The
  ``$.`` keys of ``SYSTEM_KEYS`` are system properties (``$.ifid`` is ``iothub-interface-id``, ``$.sub``
  ``dt-subject``); the rest, other ``$.`` keys included, are application properties. A key with no ``=`` is an
  application property with a null value.
* ``$.sid`` / ``$.pk`` carry ``sessionId`` / ``partitionKey`` (Service Bus's SessionId and PartitionKey; IoT
  Hub has neither), which pin a message to an upstream partition.
* MQTT 5: content type → ``contentType``; correlation data (UTF-8) → ``cid``; message expiry interval →
  ``absolute-expiry-time``; user properties are read like the property bag (``$.`` names are system
  properties, so ``$.sid`` / ``$.pk`` as user properties too: MQTT 5 has no session-id field). On delivery
  the same properties go out both in the topic's bag and, to MQTT 5 clients, as MQTT 5 properties.
* Direct methods: the hub sends a call on ``$iothub/methods/POST/{name}/?$rid={rid}`` (``method_request_topic``)
  to a client subscribed to it; the client answers on ``$iothub/methods/res/{status}/?$rid={rid}``
  (``parse_method_response``), which is never a message.
* Plain MQTT topics (granted by an ACL) enter routing as telemetry of the identity, with the MQTT topic kept in
  the application property ``PLAIN_TOPIC_PROPERTY`` (``mqtt-topic``).
* The connection system properties (``connectionDeviceId``, ``connectionModuleId``,
  ``connectionAuthMethod``) always come from the authenticated identity, never from what the client sent.

Every function here is pure: no I/O, no clock (times are passed in). Nothing here caches what a client sent
(a process-wide cache of topics let one client hold 268 MB in it); the server keeps a per-connection cache of
accepted topics, bounded in bytes. The one process-wide memo, of quoted names and values on delivery, keeps
short strings only (``_QUOTED_MAX_LEN``), so its bytes are bounded too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import parse_qsl, quote, unquote

from edgehub.core import Identity, InvalidMessageError, Message, SystemProperty
from edgehub.core.property_bag import BAG_KEYS
from edgehub.core.refusals import RefusalReason

__all__ = [
    "PLAIN_TOPIC_PROPERTY",
    "SYSTEM_KEYS",
    "Acl",
    "PlainTopic",
    "TelemetryTopic",
    "TopicError",
    "TwinRequest",
    "TwinResponse",
    "UsernameInfo",
    "decode_property_bag",
    "delivery_user_properties",
    "device_bound_topic",
    "encode_property_bag",
    "is_method_response",
    "message_from_publish",
    "method_request_topic",
    "module_input_topic",
    "parse_client_id",
    "parse_method_response",
    "parse_publish_topic",
    "parse_twin_request",
    "parse_username",
    "telemetry_topic",
    "topic_matches",
    "twin_response_topic",
    "username_identity",
]

PLAIN_TOPIC_PROPERTY = "mqtt-topic"

# Property-bag keys and the system properties they carry: the one table, shared with the upstream's message mode.
SYSTEM_KEYS: Mapping[str, SystemProperty] = BAG_KEYS
_KEY_OF: Mapping[str, str] = {v.value: k for k, v in SYSTEM_KEYS.items()}
_OUTPUT_NAME: str = SystemProperty.OUTPUT_NAME.value  # a plain str compares faster than the StrEnum member
_QUOTED_KEY_OF: Mapping[str, str] = {name: quote(key, safe="$.") for name, key in _KEY_OF.items()}
# What a client may not set about itself: it is taken from the authenticated connection.
_CONNECTION_OWNED = frozenset(
    {
        SystemProperty.CONNECTION_DEVICE_ID,
        SystemProperty.CONNECTION_MODULE_ID,
        SystemProperty.CONNECTION_AUTH_METHOD,
    }
)


class TopicError(InvalidMessageError):
    """A topic name that is not one the hub accepts from this identity (MQTT 5: 0x90 topic name invalid)."""

    reason = RefusalReason.TOPIC_INVALID


# --- client id and username -------------------------------------------------------------------------------------


def parse_client_id(client_id: str) -> Identity:
    """``deviceId`` or ``deviceId/moduleId``; raises ValueError for anything else."""
    if client_id.count("/") > 1:
        raise ValueError(f"client id {client_id!r} is not deviceId or deviceId/moduleId")
    return Identity.parse(client_id)


@dataclass(frozen=True, slots=True)
class UsernameInfo:
    host: str
    identity: Identity
    params: Mapping[str, str] = field(default_factory=dict)

    @property
    def api_version(self) -> str | None:
        return self.params.get("api-version")


def parse_username(username: str) -> UsernameInfo:
    """``{host}/{deviceId}[/{moduleId}]/?api-version=...[&k=v...]``; raises ValueError when it is not that."""
    path, sep, query = username.partition("/?")
    if not sep:
        raise ValueError(f"username {username!r} has no '/?' query part")
    parts = path.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"username {username!r} is not host/device[/module]/?...")
    identity = Identity.parse("/".join(parts[1:]))
    return UsernameInfo(parts[0], identity, dict(parse_qsl(query, keep_blank_values=True)))


def username_identity(username: str, client_id: str) -> Identity:
    """The identity a CONNECT's username names: ``{host}/{deviceId}[/{moduleId}]`` with or without the
    ``/?api-version=...`` part, or the client id itself (plain password logins). Raises ValueError for anything
    else; the caller checks that it is the identity the client id claims."""
    if username == client_id:
        return parse_client_id(client_id)
    if "/?" in username:
        return parse_username(username).identity
    parts = username.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"username {username!r} is not host/device[/module]")
    return Identity.parse("/".join(parts[1:]))


# --- property bag ------------------------------------------------------------------------------------------------


# Most names and values are plain words, ids and numbers: those need no quoting, and a match is cheaper than
# quote(), which showed in the profile of delivering to modules.
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")


# quote() is some twenty times slower than the match for a plain word: names and values are remembered quoted
# (device ids, content types, property names and values recur on every message of a device), a look-up being
# cheaper than either. Bounded: cleared when full (unique values, such as message ids, pass), and only strings of
# up to _QUOTED_MAX_LEN characters are kept: 4,096 entries of 64 KB values would be 268 MB.
_QUOTED: dict[str, str] = {}
_QUOTED_MAX = 4096
_QUOTED_MAX_LEN = 128
_SYSTEM_PARTS: dict[tuple[str, str], str] = {}


def _quote_value(text: str) -> str:
    quoted = _QUOTED.get(text)
    if quoted is None:
        quoted = text if _UNRESERVED.fullmatch(text) else quote(text, safe="")
        if len(text) <= _QUOTED_MAX_LEN:
            if len(_QUOTED) >= _QUOTED_MAX:
                _QUOTED.clear()
            _QUOTED[text] = quoted
    return quoted


def encode_property_bag(
    system: Mapping[str, str], properties: Mapping[str, str | None], *, skip: str | None = None
) -> str:
    """The bag for these system properties (only those with a ``$.`` key, less ``skip``) and application
    properties."""
    parts: list[str] = []
    key_of, known = _QUOTED_KEY_OF, _SYSTEM_PARTS
    for item in system.items():
        name = item[0]
        if name in key_of and name != skip:
            # "key=value" remembered whole per (name, value): device ids, auth methods and content types recur
            # on every message of a device (bounded like _QUOTED; unique values such as message ids pass).
            part = known.get(item)
            if part is None:
                part = f"{key_of[name]}={_quote_value(item[1])}"
                if len(item[1]) <= _QUOTED_MAX_LEN:
                    if len(known) >= _QUOTED_MAX:
                        known.clear()
                    known[item] = part
            parts.append(part)
    for name, app_value in properties.items():
        if app_value is None:
            parts.append(_quote_value(name))
        else:
            parts.append(f"{_quote_value(name)}={_quote_value(app_value)}")
    return "&".join(parts)


def decode_property_bag(bag: str) -> tuple[dict[str, str], dict[str, str | None]]:
    """``(system, application)`` from a bag; system keys are SystemProperty names. Unknown ``$.`` keys are
    kept as application properties, so that nothing the client sent is lost."""
    system_items, app_items = _decode_bag(bag)
    return dict(system_items), dict(app_items)


def _decode_bag(bag: str) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str | None], ...]]:
    system: dict[str, str] = {}
    app: dict[str, str | None] = {}
    if not bag:
        return (), ()
    for part in bag.split("&"):
        if not part:
            continue
        raw_key, sep, raw_value = part.partition("=")
        key = unquote(raw_key)
        value = unquote(raw_value) if sep else None
        sp = SYSTEM_KEYS.get(key)
        if sp is not None:
            system[sp.value] = value or ""
        else:
            app[key] = value
    return tuple(system.items()), tuple(app.items())


# --- topics ------------------------------------------------------------------------------------------------------

_SEG = r"([^/#+]+)"
_DEVICE_EVENTS = re.compile(rf"^devices/{_SEG}/messages/events(?:/(.*))?$")
_MODULE_EVENTS = re.compile(rf"^devices/{_SEG}/modules/{_SEG}/messages/events(?:/(.*))?$")
_TWIN_REQUEST = re.compile(r"^\$iothub/twin/(GET|PATCH/properties/reported)/\?(.*)$")


@dataclass(frozen=True, slots=True)
class TelemetryTopic:
    identity: Identity
    bag: str


@dataclass(frozen=True, slots=True)
class TwinRequest:
    """``$iothub/twin/GET/?$rid=..`` (``operation`` "GET") or ``$iothub/twin/PATCH/properties/reported/?$rid=..``
    (``operation`` "PATCH_REPORTED")."""

    operation: str
    rid: str
    params: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TwinResponse:
    topic: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class PlainTopic:
    topic: str


def parse_twin_request(topic: str) -> TwinRequest | None:
    m = _TWIN_REQUEST.match(topic)
    if m is None:
        return None
    params = dict(parse_qsl(m.group(2), keep_blank_values=True))
    op = "GET" if m.group(1) == "GET" else "PATCH_REPORTED"
    return TwinRequest(op, params.get("$rid", ""), params)


def twin_response_topic(status: int, rid: str, *, version: int | None = None) -> str:
    """``$iothub/twin/res/{status}/?$rid={rid}[&$version={v}]``."""
    topic = f"$iothub/twin/res/{status}/?$rid={rid}"
    if version is not None:
        topic += f"&$version={version}"
    return topic


def parse_publish_topic(topic: str) -> TelemetryTopic | TwinRequest | PlainTopic:
    """What a PUBLISH topic is. Telemetry topics carry the identity they name (the ACL checks it)."""
    m = _MODULE_EVENTS.match(topic)
    if m is not None:
        return TelemetryTopic(Identity.parse(f"{m.group(1)}/{m.group(2)}"), (m.group(3) or "").rstrip("/"))
    m = _DEVICE_EVENTS.match(topic)
    if m is not None:
        return TelemetryTopic(Identity.parse(m.group(1)), (m.group(2) or "").rstrip("/"))
    twin = parse_twin_request(topic)
    if twin is not None:
        return twin
    return PlainTopic(topic)


def is_method_response(topic: str) -> bool:
    """``$iothub/methods/res/{status}/?$rid=...``: a device's answer to a direct method call."""
    return topic.startswith("$iothub/methods/res/")


_METHOD_RESPONSE = re.compile(r"^\$iothub/methods/res/(\d{1,6})/\?(.*)$")


def parse_method_response(topic: str) -> tuple[int, str] | None:
    """``(status, rid)`` of ``$iothub/methods/res/{status}/?$rid={rid}``; None when the topic is not that (no
    ``$rid``, or a status that is not a number of at most six digits)."""
    m = _METHOD_RESPONSE.match(topic)
    if m is None:
        return None
    rid = dict(parse_qsl(m.group(2), keep_blank_values=True)).get("$rid")
    if not rid:
        return None
    return int(m.group(1)), rid


def method_request_topic(name: str, rid: str) -> str:
    """``$iothub/methods/POST/{name}/?$rid={rid}``: how a client receives a direct method call."""
    return f"$iothub/methods/POST/{name}/?$rid={rid}"


def telemetry_topic(identity: Identity, message: Message | None = None) -> str:
    """The topic a device or module sends ``message`` on (its bag from the message's properties)."""
    base = f"devices/{identity.device_id}"
    if identity.module_id is not None:
        base += f"/modules/{identity.module_id}"
    bag = encode_property_bag(message.system_properties, message.properties) if message is not None else ""
    return f"{base}/messages/events/{bag}"


def _outbound_system(message: Message) -> dict[str, str]:
    # The output name is the sender's business; the receiver learns the sender from $.cdid/$.cmid.
    return {k: v for k, v in message.system_properties.items() if k != SystemProperty.OUTPUT_NAME}


def module_input_topic(identity: Identity, input_name: str, message: Message) -> str:
    """``devices/{d}/modules/{m}/inputs/{input}/{bag}``: how a module receives ``message`` on ``input_name``."""
    if identity.module_id is None:
        raise ValueError("module inputs need a module identity")
    bag = encode_property_bag(message.system_properties, message.properties, skip=_OUTPUT_NAME)
    return f"devices/{identity.device_id}/modules/{identity.module_id}/inputs/{input_name}/{bag}"


def device_bound_topic(identity: Identity, message: Message) -> str:
    """``devices/{d}/messages/devicebound/{bag}``."""
    bag = encode_property_bag(message.system_properties, message.properties, skip=SystemProperty.OUTPUT_NAME)
    return f"devices/{identity.device_id}/messages/devicebound/{bag}"


def delivery_user_properties(message: Message) -> tuple[tuple[str, str], ...]:
    """MQTT 5 user properties for an outbound message: the same names as the bag."""
    out: list[tuple[str, str]] = []
    for name, value in _outbound_system(message).items():
        key = _KEY_OF.get(name)
        if key is not None:
            out.append((key, value))
    out.extend((k, v if v is not None else "") for k, v in message.properties.items())
    return tuple(out)


# --- topic filters and ACLs --------------------------------------------------------------------------------------


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic filter matching (``+`` one level, ``#`` the rest); ``$`` topics never match a leading
    wildcard [MQTT-4.7.2-1]."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_parts = topic_filter.split("/")
    t_parts = topic.split("/")
    for i, fp in enumerate(f_parts):
        if fp == "#":
            return i == len(f_parts) - 1
        if i >= len(t_parts):
            return False
        if fp != "+" and fp != t_parts[i]:
            return False
    return len(f_parts) == len(t_parts)


def _filter_within(topic_filter: str, allowed: str) -> bool:
    """Whether every topic ``topic_filter`` can match is matched by ``allowed``. A wildcard level becomes
    U+0000, which no real topic level can hold, so it matches only a wildcard of ``allowed``."""
    return topic_matches(allowed, topic_filter.replace("+", "\x00").replace("#", "\x00"))


@dataclass(frozen=True, slots=True)
class Acl:
    """Who may publish and subscribe where.

    Built in: a device publishes only to its own telemetry and twin topics (and method responses); a module
    only to its own. A device subscribes to its own device-bound, twin and method topics; a module to its own
    inputs (``devices/{d}/modules/{m}/inputs/#`` or ``devices/{d}/modules/{m}/#``), twin and method topics, and
    the answers to the methods it calls. (A child hub's subscriptions for the devices behind it are not the ACL's:
    the hub's identities decide them, ``children.py``; the method PUBLISHes are ``methods.py``'s.)
    ``publish_grants``/``subscribe_grants`` add plain MQTT topic filters per identity id (``d`` or ``d/m``).
    """

    publish_grants: Mapping[str, Sequence[str]] = field(default_factory=dict)
    subscribe_grants: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def may_publish(self, identity: Identity, topic: str) -> bool:
        parsed = parse_publish_topic(topic)
        if isinstance(parsed, TelemetryTopic):
            return parsed.identity == identity
        if isinstance(parsed, TwinRequest) or is_method_response(topic):
            return True
        return any(topic_matches(f, topic) for f in self.publish_grants.get(identity.id, ()))

    def may_subscribe(self, identity: Identity, topic_filter: str) -> bool:
        allowed: Iterable[str] = _own_subscriptions(identity)
        if any(topic_filter == a or _filter_within(topic_filter, a) for a in allowed):
            return True
        return any(
            topic_filter == g or _filter_within(topic_filter, g) for g in self.subscribe_grants.get(identity.id, ())
        )


def _own_subscriptions(identity: Identity) -> list[str]:
    common = ["$iothub/twin/res/#", "$iothub/twin/PATCH/properties/desired/#", "$iothub/methods/POST/#"]
    if identity.module_id is None:
        return [f"devices/{identity.device_id}/messages/devicebound/#", *common]
    # A module may call methods (protocol_heads.mqtt.methods) and receives the answers on these.
    answers = ["$iothub/+/methods/res/#", "$iothub/+/+/methods/res/#"]
    return [f"devices/{identity.device_id}/modules/{identity.module_id}/#", *common, *answers]


# --- messages ----------------------------------------------------------------------------------------------------


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).isoformat().replace("+00:00", "Z")


def message_from_publish(
    identity: Identity,
    topic: str,
    payload: bytes,
    *,
    auth_method: str,
    now_s: float,
    content_type: str | None = None,
    correlation_data: bytes | None = None,
    message_expiry_s: int | None = None,
    user_properties: Sequence[tuple[str, str]] = (),
    base: tuple[Mapping[str, str], Mapping[str, str | None]] | None = None,
) -> Message:
    """The hub message for a telemetry or plain PUBLISH from ``identity`` (ACL already checked).

    ``base``: the (system, application) properties of a message on this topic without MQTT 5 properties, as
    an earlier call gave them for the same identity and auth method; the topic is then not parsed again.

    Raises ``TopicError`` for a twin topic (not a message) or a telemetry topic of another identity, and
    ``InvalidMessageError`` for correlation data that is not UTF-8."""
    system: dict[str, str] = {}
    app: dict[str, str | None] = {}
    parsed = parse_publish_topic(topic) if base is None else None
    if base is not None:
        system, app = dict(base[0]), dict(base[1])
    elif isinstance(parsed, TelemetryTopic):
        if parsed.identity != identity:
            raise TopicError(f"{identity} may not publish as {parsed.identity}", reason=RefusalReason.TOPIC_INVALID)
        system, app = decode_property_bag(parsed.bag)
    elif isinstance(parsed, TwinRequest):
        raise TopicError("twin requests are not messages", reason=RefusalReason.TOPIC_INVALID)
    else:
        app[PLAIN_TOPIC_PROPERTY] = topic
    for key, value in user_properties:
        sp = SYSTEM_KEYS.get(key)
        if sp is not None:
            system[sp.value] = value
        else:
            app[key] = value
    if content_type is not None:
        system[SystemProperty.CONTENT_TYPE] = content_type
    if correlation_data is not None:
        try:
            system[SystemProperty.CORRELATION_ID] = correlation_data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidMessageError("correlation data is not UTF-8 text") from exc
    if message_expiry_s is not None:
        system[SystemProperty.ABSOLUTE_EXPIRY_TIME] = _iso(now_s + message_expiry_s)
    for owned in _CONNECTION_OWNED:
        system.pop(owned, None)
    if identity.module_id is None:
        # Output names belong to modules (docs/routes.md, "Sources": a device's messages have source /messages).
        system.pop(SystemProperty.OUTPUT_NAME, None)
    system[SystemProperty.CONNECTION_DEVICE_ID] = identity.device_id
    if identity.module_id is not None:
        system[SystemProperty.CONNECTION_MODULE_ID] = identity.module_id
    system[SystemProperty.CONNECTION_AUTH_METHOD] = auth_method
    return Message(body=payload, properties=app, system_properties=system)
