"""The twin and direct methods over AMQP, as Azure IoT Hub serves them and its device SDKs (C's
``iothubtransport_amqp_twin_messenger``/``_methods``, Node's ``AmqpTwinClient``/``AmqpDeviceMethodClient``, C#'s
``AmqpIotConstants``) speak them: the conventions as pure functions, and ``Channels``, one connection's pair of
twin links and pair of method links, which hands the requests to the hub (``Hub.get_twin``,
``Hub.update_reported``, ``Hub.method_response``) and carries the hub's patches and calls out.

The wire (the addresses are ``iothub.parse_address``'s: ``/devices/{d}[/modules/{m}]/twin`` and
``.../methods/devicebound``, each attached both ways, with the link property
``com.microsoft:channel-correlation-id``, ``twin:{uuid}`` or ``methods:{uuid}``, which the hub echoes):

* twin request (client → hub): message annotations ``operation`` (``GET``, ``PATCH``, ``PUT``, ``DELETE``) and
  ``resource`` (``/properties/reported`` for a PATCH, ``/notifications/twin/properties/desired`` for PUT, which
  subscribes to desired-property patches, and DELETE, which unsubscribes), a correlation id, the patch as the body;
* twin answer (hub → client): the request's correlation id, annotation ``status`` (an int: 200 with the twin
  ``{"desired": ..., "reported": ...}`` as the body for GET, 204 and annotation ``version`` for a PATCH, 200 for
  PUT/DELETE; IoT Hub's error statuses as over MQTT, from ``edgehub.hub.twins``, and 500 when the hub failed);
  a correlation id AMQP does not allow (not a string, ulong, uuid or binary) is not echoed;
* desired-property patch (hub → client): no correlation id, the merge patch (JSON, with ``$version``) as the body
  and annotation ``version``;
* method call (hub → client): the hub's request id as correlation id, a UUID as IoT Hub sends it (the C SDK
  rejects any other type: ``iothubtransportamqp_methods`` reads it with ``amqpvalue_get_uuid``), application
  property ``IoThub-methodname``, the JSON payload as the body; the answer (client → hub): the same correlation
  id (the C SDK echoes the UUID, Node's its text form: both are taken), application property ``IoThub-status``,
  the payload as the body. The hub's request ids are hex counters (``edgehub.hub.methods``), so the UUID is the
  id's number, and an answer's UUID gives the id back without any table.

Invariants:
* the rules are the hub's (one home each): patch limits and parsing in ``edgehub.hub.twins``, calls, their
  bounds, 404 and 504 in ``edgehub.hub.methods``; this module only translates;
* bounded: a connection has at most one twin and one method link each way (another is refused
  ``amqp:not-allowed``), and at most ``REQUEST_CREDIT`` twin requests and ``ANSWER_CREDIT`` method answers in
  progress (the links' credit, given back as each is answered: a twin request's once its answer has gone out, so
  a client that gives the twin link no credit cannot make the hub hold more); a request that is not one of the four is
  answered 400, an answer for no pending call is rejected: each logged once through the refusal log;
* answers and patches go out pre-settled (as IoT Hub sends them) and only on credit the client gave; made before
  it gave any (an SDK may flow only after its first request), they wait for it: twin answers (at most
  ``REQUEST_CREDIT``, one per request in progress) and desired patches (at most ``MAX_HELD_PATCHES``, then the
  oldest goes, logged). A call is never held: with no credit it is not sent, and the hub answers the caller 404,
  as for a client that does not listen.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from proton import Link, int32, symbol
from proton import Message as AmqpMessage

from edgehub.core import Identity, TwinError
from edgehub.core.logtext import shown
from edgehub.core.refusals import RefusalReason
from edgehub.hub import Hub
from protocol_heads.amqp import events as ev
from protocol_heads.amqp.connection import NOT_ALLOWED, AmqpConnection
from protocol_heads.amqp.iothub import AddressKind
from protocol_heads.socket_side import SessionSocket

__all__ = [
    "ANSWER_CREDIT",
    "CHANNEL_CORRELATION_ID",
    "METHOD_NAME",
    "METHOD_STATUS",
    "REQUEST_CREDIT",
    "Channels",
    "TwinOperation",
    "TwinRequest",
    "desired_patch_message",
    "method_request_message",
    "parse_method_response",
    "parse_twin_request",
    "twin_response",
]

log = logging.getLogger(__name__)

CHANNEL_CORRELATION_ID = symbol("com.microsoft:channel-correlation-id")
METHOD_NAME = "IoThub-methodname"
METHOD_STATUS = "IoThub-status"
REQUEST_CREDIT = 8  # twin requests in progress per connection
ANSWER_CREDIT = 16  # method answers in progress per connection (the hub bounds the calls: max_pending_per_connection)
_STATUS = symbol("status")
_VERSION = symbol("version")
_REPORTED = "/properties/reported"
_DESIRED_NOTIFICATIONS = "/notifications/twin/properties/desired"
MAX_HELD_PATCHES = 16  # desired patches waiting for the client's credit on its twin link
_BAD_REQUEST = 400
_SERVER_ERROR = 500


class TwinOperation(StrEnum):
    GET = "get"
    PATCH_REPORTED = "patch_reported"
    SUBSCRIBE_DESIRED = "subscribe_desired"
    UNSUBSCRIBE_DESIRED = "unsubscribe_desired"


@dataclass(frozen=True, slots=True)
class TwinRequest:
    operation: TwinOperation
    correlation_id: object
    body: bytes


def _body(message: AmqpMessage) -> bytes:
    body = message.body
    if body is None:
        return b""
    if isinstance(body, bytes | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    raise ValueError("body is neither data nor a string value")


def parse_twin_request(message: AmqpMessage) -> TwinRequest:
    """The request ``message`` makes (module docstring); raises ValueError for anything else (the answer is 400,
    with the request's correlation id)."""
    annotations = message.annotations if isinstance(message.annotations, dict) else {}
    operation = annotations.get("operation")
    resource = annotations.get("resource")
    if operation == "GET":
        op = TwinOperation.GET
    elif operation == "PATCH" and resource == _REPORTED:
        op = TwinOperation.PATCH_REPORTED
    elif operation == "PUT" and resource == _DESIRED_NOTIFICATIONS:
        op = TwinOperation.SUBSCRIBE_DESIRED
    elif operation == "DELETE" and resource == _DESIRED_NOTIFICATIONS:
        op = TwinOperation.UNSUBSCRIBE_DESIRED
    else:
        raise ValueError(f"twin operation {shown(str(operation), 16)} on {shown(str(resource), 64)} is not served")
    return TwinRequest(op, message.correlation_id, _body(message) if op is TwinOperation.PATCH_REPORTED else b"")


_MESSAGE_ID_TYPES = (str, int, uuid.UUID, bytes)  # what AMQP's message-id and correlation-id may be


def twin_response(correlation_id: object, status: int, body: bytes = b"", *, version: int | None = None) -> AmqpMessage:
    """The answer to a request whose correlation id was ``correlation_id`` (echoed when it is one AMQP allows)."""
    if isinstance(correlation_id, memoryview):  # how proton decodes a binary id
        correlation_id = bytes(correlation_id)
    answer = AmqpMessage(correlation_id=correlation_id if isinstance(correlation_id, _MESSAGE_ID_TYPES) else None)
    if body:
        answer.body = body
        answer.inferred = True  # bytes as a data section, as IoT Hub sends them
    annotations: dict[symbol, object] = {_STATUS: int32(status)}
    if version is not None:
        annotations[_VERSION] = version
    answer.annotations = annotations
    return answer


def desired_patch_message(patch: bytes, version: int) -> AmqpMessage:
    message = AmqpMessage(body=patch, inferred=True)
    message.annotations = {_VERSION: version}
    return message


def _call_id(rid: str) -> uuid.UUID | str:
    """The correlation id a call with the hub's request id ``rid`` goes out with (module docstring)."""
    try:
        return uuid.UUID(int=int(rid, 16))
    except ValueError:  # not a hex counter (over 128 bits, or another form): as text
        return rid


def _rid_of(correlation_id: object) -> str:
    """The hub's request id an answer's correlation id names (``_call_id`` backwards)."""
    if isinstance(correlation_id, memoryview | bytes) and len(correlation_id) == 16:
        correlation_id = uuid.UUID(bytes=bytes(correlation_id))  # a UUID a client sent back as binary
    elif isinstance(correlation_id, str) and len(correlation_id) == 36:
        try:
            correlation_id = uuid.UUID(correlation_id)  # the UUID as text, as the Node SDK answers
        except ValueError:
            pass
    if isinstance(correlation_id, uuid.UUID):
        return format(correlation_id.int, "x")
    return _text_id(correlation_id)


def method_request_message(rid: str, name: str, payload: bytes) -> AmqpMessage:
    message = AmqpMessage(body=payload, inferred=True, correlation_id=_call_id(rid))
    message.properties = {METHOD_NAME: name}
    return message


def _text_id(value: object) -> str:
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | memoryview):
        return bytes(value).decode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ValueError("a method answer's correlation id is the call's")


def parse_method_response(message: AmqpMessage) -> tuple[str, int, bytes]:
    """``(request id, status, payload)`` of a method answer; raises ValueError for anything else."""
    properties = message.properties if isinstance(message.properties, dict) else {}
    status = properties.get(METHOD_STATUS)
    if isinstance(status, str) and status.isdigit() and len(status) <= 6:
        status = int(status)
    if not isinstance(status, int) or isinstance(status, bool) or not 0 <= status < 1_000_000:
        raise ValueError(f"{METHOD_STATUS} is not a status")
    if message.correlation_id is None:
        raise ValueError("a method answer carries the call's correlation id")
    return _rid_of(message.correlation_id), int(status), _body(message)


class ChannelsSession(Protocol):
    """What ``Channels`` asks of the session of its connection (``session.Session`` is one)."""

    @property
    def hub(self) -> Hub: ...

    @property
    def conn(self) -> AmqpConnection: ...

    @property
    def identity(self) -> Identity | None: ...

    @property
    def sock(self) -> SessionSocket: ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None: ...


class Channels:
    """One connection's twin and method links (module docstring)."""

    def __init__(self, session: ChannelsSession) -> None:
        self._session = session
        self._out: dict[AddressKind, Link] = {}  # the links the hub sends on, by kind
        self._in: dict[str, AddressKind] = {}  # the names of the links the client sends on
        self._in_kinds: set[AddressKind] = set()
        # (the request's link, None for a patch; the encoded message) waiting for credit on the twin link
        self._held: deque[tuple[Link | None, bytes]] = deque()
        self.desired_subscribed = False

    # --- links ------------------------------------------------------------------------------------------------

    def attach(self, kind: AddressKind, link: Link, *, outgoing: bool) -> None:
        """The client attached a twin or method link of its own identity (the session checked the address)."""
        conn = self._session.conn
        taken = kind in self._out if outgoing else kind in self._in_kinds
        if taken:
            self._session.sock.refused(RefusalReason.TOO_MANY_LINKS, kind=kind.value, why="a second link one way")
            conn.refuse_link(link, NOT_ALLOWED, f"one {kind.value} link each way per connection")
            return
        try:
            properties = link.remote_properties
        except Exception:  # proton decodes them when read: not a map
            properties = None
        channel = properties.get(CHANNEL_CORRELATION_ID) if isinstance(properties, dict) else None
        if isinstance(channel, str) and len(channel) <= 256:
            link.properties = {CHANNEL_CORRELATION_ID: channel}  # echoed, as IoT Hub does
        if outgoing:
            self._out[kind] = link
            conn.accept_link(link)
        else:
            self._in[link.name] = kind
            self._in_kinds.add(kind)
            conn.accept_link(link, credit=REQUEST_CREDIT if kind is AddressKind.TWIN else ANSWER_CREDIT)

    def serves(self, link_name: str) -> bool:
        return link_name in self._in

    def link_closed(self, link: Link) -> bool:
        """Forget ``link`` if it is one of these; whether it was."""
        if link.is_receiver:
            kind = self._in.pop(link.name, None)
            if kind is None:
                return False
            self._in_kinds.discard(kind)
            return True
        for kind, own in list(self._out.items()):
            if own.name == link.name:
                del self._out[kind]
                if kind is AddressKind.TWIN:
                    self.desired_subscribed = False  # the patches have nowhere to go
                    while self._held:  # nor the answers: their requests' credit comes back all the same
                        self._answered(self._held.popleft()[0])
                return True
        return False

    def clear(self) -> None:
        self._held.clear()
        self._out.clear()
        self._in.clear()
        self._in_kinds.clear()

    # --- client → hub -----------------------------------------------------------------------------------------

    def on_message(self, event: ev.MessageReceived) -> None:
        """A transfer on the client's twin or method link: settled at once (a request is answered by a message of
        its own, not by the outcome), handled, and its credit given back once it is answered."""
        session, conn = self._session, self._session.conn
        kind = self._in[event.link_name]
        try:
            message = AmqpMessage()
            message.decode(event.body)
        except Exception as exc:  # proton's decode errors: not a message
            session.sock.refused(RefusalReason.INVALID_MESSAGE, kind=kind.value, detail=shown(str(exc), 200))
            self._settle(event, NOT_ALLOWED, "not an AMQP message")
            conn.give_credit(event.link, 1)
            return
        if kind is AddressKind.METHODS:
            self._on_method_answer(event, message)
            conn.give_credit(event.link, 1)
            return
        self._settle(event)
        try:
            request = parse_twin_request(message)
        except ValueError as exc:
            session.sock.refused(RefusalReason.TWIN_INVALID, kind="twin", detail=shown(str(exc), 200))
            self._answer(twin_response(message.correlation_id, _BAD_REQUEST), event.link)
            return
        session.spawn(self._twin(request, event.link), "amqp.twin")

    def _settle(self, event: ev.MessageReceived, condition: str | None = None, text: str = "") -> None:
        if not event.settled:
            self._session.conn.settle(event.delivery, condition, text)

    def _on_method_answer(self, event: ev.MessageReceived, message: AmqpMessage) -> None:
        session = self._session
        identity = session.identity
        try:
            rid, status, payload = parse_method_response(message)
        except ValueError as exc:
            session.sock.refused(RefusalReason.INVALID_MESSAGE, kind="method answer", detail=shown(str(exc), 200))
            self._settle(event, NOT_ALLOWED, str(exc))
            return
        if identity is None or not session.hub.method_response(identity, rid, status, payload):
            session.sock.refused(RefusalReason.NO_PENDING_CALL, rid=shown(rid, 64))
            self._settle(event, NOT_ALLOWED, "no direct method call is pending")
            return
        self._settle(event)

    async def _twin(self, request: TwinRequest, link: Link) -> None:
        session = self._session
        identity = session.identity
        assert identity is not None  # the links are attached only once the client has one
        cid = request.correlation_id
        try:
            if request.operation is TwinOperation.GET:
                twin = await session.hub.get_twin(identity)
                answer = twin_response(cid, 200, json.dumps(twin).encode())
            elif request.operation is TwinOperation.PATCH_REPORTED:
                try:
                    # The hub parses the raw patch (edgehub.hub.twins): bounded size and depth before any json.loads.
                    version = await session.hub.update_reported(identity, request.body)
                except TwinError as exc:  # refused and logged by the hub; the client gets IoT Hub's status
                    answer = twin_response(cid, exc.status)
                else:
                    answer = twin_response(cid, 204, version=version)
            else:
                self.desired_subscribed = request.operation is TwinOperation.SUBSCRIBE_DESIRED
                answer = twin_response(cid, 200)
        except Exception:  # the store failed, or a bug: this request fails, not the connection
            log.exception("amqp.twin_failed client=%s operation=%s", identity, request.operation.value)
            answer = twin_response(cid, _SERVER_ERROR)
        self._answer(answer, link)
        session.sock.schedule_flush()

    # --- hub → client -----------------------------------------------------------------------------------------

    def _send(self, kind: AddressKind, payload: bytes) -> bool:
        session = self._session
        link = self._out.get(kind)
        if link is None or session.conn.closed or link.credit <= 0:
            return False
        try:
            delivery = session.conn.send(link, "", payload)
        except Exception as exc:  # PeerMessageTooLarge: over the client's max-message-size
            log.info("amqp.channel_send_failed kind=%s client=%s detail=%s", kind.value, session.identity, exc)
            return True  # it can never go: not held
        delivery.settle()  # sent settled, as IoT Hub sends them: nothing to wait for
        session.sock.schedule_flush()
        return True

    def _twin_out(self, payload: bytes, request_link: Link | None) -> None:
        """A twin answer (to a request on ``request_link``) or patch (None), now if there is credit and nothing older
        waits, else held (module docstring). The request's credit comes back once its answer has gone (or can never
        go): a client that gives the twin link no credit cannot make answers pile up."""
        conn = self._session.conn
        if conn.closed:
            return  # the connection ended while the request was in the hub: nobody to tell
        if not self._held and self._send(AddressKind.TWIN, payload):
            self._answered(request_link)
            return
        if AddressKind.TWIN not in self._out:
            self._session.sock.refused(RefusalReason.NOT_READING, kind="twin", why="no twin link to answer on")
            self._answered(request_link)
            return
        if request_link is None and sum(link is None for link, _ in self._held) >= MAX_HELD_PATCHES:
            dropped = next(i for i, (link, _) in enumerate(self._held) if link is None)
            del self._held[dropped]
            self._session.sock.refused(RefusalReason.NOT_READING, kind="desired patch", why="no credit")
        self._held.append((request_link, payload))

    def _answered(self, request_link: Link | None) -> None:
        if request_link is not None:
            self._session.conn.give_credit(request_link, 1)

    def credit_added(self, link: Link) -> None:
        """The client gave ``link`` credit: what waited for it goes."""
        own = self._out.get(AddressKind.TWIN)
        if own is None or own.name != link.name:
            return
        while self._held and self._send(AddressKind.TWIN, self._held[0][1]):
            self._answered(self._held.popleft()[0])

    def _answer(self, message: AmqpMessage, request_link: Link) -> None:
        self._twin_out(message.encode(), request_link)

    def send_desired_patch(self, patch: bytes, version: int) -> None:
        """``TwinLink``: the patch, if the client subscribed to them (PUT); never raises."""
        if self.desired_subscribed:
            self._twin_out(desired_patch_message(patch, version).encode(), None)

    def send_method_request(self, rid: str, name: str, payload: bytes) -> bool:
        """``MethodLink``: the call, if the client attached its method links and gave credit."""
        if AddressKind.METHODS not in self._in_kinds:
            return False  # it could not answer: IoT Hub answers 404 for a device that does not listen
        link = self._out.get(AddressKind.METHODS)
        if link is None or link.credit <= 0:
            return False
        return self._send(AddressKind.METHODS, method_request_message(rid, name, payload).encode())
