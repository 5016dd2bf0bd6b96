"""The session side of one MQTT connection: what the client is to the hub. It authenticates the client,
acts on ``ServerConnection``'s events (subscriptions, deliveries' acks, will), hands each read's PUBLISHes to
``Hub.ingest`` as one group, answers twin requests, and carries the hub's deliveries out (``SessionLink``, ``link.py``).

It never touches the socket: bytes, timers and reading pauses belong to the socket side (``ClientSocket`` in
``client_socket.py``), which feeds it reads and which it asks to flush, pause or end. It sees that side only as
``MqttSocket`` and its server only as ``HeadServer`` (what both heads' servers share), so this module imports
neither the socket module nor the server module, which build it.

Invariants:
* All PUBLISHes of one socket read go to ``Hub.ingest`` as one group (one task per group); acks leave in
  arrival order because ``ServerConnection.settle_many`` orders them, however the groups finish.
* A delivery's ack is settled in one place (``_delivered``), whichever way the read that carried it was decoded.
* One live connection per identity: a new one takes the session over and the old one is closed (MQTT 5: 0x8E);
  the hub is told with ``Hub.connect`` and the old link's deliveries come again on the new link. An identity
  whose credentials are removed or rotated is closed at once (``revoke``; MQTT 5: 0x98, no will).
* A refused message gets MQTT 5's reason (``refusals.REJECT_REASONS``, the one table) and the hub's detail as
  Reason String; a 3.1.1 client is disconnected instead.
* A disposed session holds nothing that leads back to its socket or its link (``dispose``), so reference
  counting alone frees a closed connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Container, Mapping
from typing import Any, Protocol

import msgspec

from edgehub.core import (
    AuthenticationError,
    EdgeHubError,
    Identity,
    IngestRejected,
    InvalidMessageError,
    Message,
    StorageIOError,
    StoreError,
    TwinError,
)
from edgehub.core.logtext import shown
from edgehub.core.refusals import RefusalReason
from edgehub.hub import STORE_UNAVAILABLE, Credentials, Rejected
from edgehub.mqtt.caches import BudgetDict
from edgehub.mqtt.packets import NO_PROPERTIES, Connect, PropertyId, Publish, ReasonCode
from protocol_heads.listeners import HeadServer
from protocol_heads.mqtt.children import Children
from protocol_heads.mqtt.connection import ServerConnection
from protocol_heads.mqtt.events import (
    ConnectRequested,
    DeliveryAcked,
    Disconnected,
    Event,
    MessageReceived,
    ProtocolFailed,
    SubscribeRequested,
    UnsubscribeRequested,
)
from protocol_heads.mqtt.iothub import (
    TelemetryTopic,
    TwinRequest,
    message_from_publish,
    parse_client_id,
    parse_publish_topic,
    parse_twin_request,
    topic_matches,
    twin_response_topic,
    username_identity,
)
from protocol_heads.mqtt.link import SessionLink
from protocol_heads.mqtt.methods import ModuleCalls
from protocol_heads.mqtt.refusals import REJECT_REASONS, STORE_FAILED
from protocol_heads.mqtt.settings import MqttSettings
from protocol_heads.socket_side import SessionSocket

__all__ = ["MqttSocket", "Session"]

log = logging.getLogger(__name__)

_LOGIN_REFUSALS: Mapping[int, RefusalReason] = {
    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID: RefusalReason.BAD_CLIENT_ID,
    ReasonCode.BAD_USERNAME_OR_PASSWORD: RefusalReason.BAD_USERNAME,
}
_ENTRY_OVERHEAD = 512  # a telemetry cache entry's two property maps and tuple, beside its topic's text


class MqttSocket(SessionSocket, Protocol):
    """What the session asks of its socket side (``ClientSocket`` is one): what both heads' sessions ask, and the
    reads before login."""

    async def read(self) -> bytes:
        """The next read before the client is live; b"" once the connection has ended."""
        ...


class Session:
    """The session side of one connection (module docstring); ``sock`` is its socket side."""

    def __init__(self, server: HeadServer[MqttSettings, Session], sock: MqttSocket, conn: ServerConnection) -> None:
        self.server = server
        self.hub = server.hub
        self.settings = server.settings
        self.sock = sock
        self.conn = conn
        self.identity: Identity | None = None
        self.auth_method = ""
        self.link = SessionLink(self)
        self.subscriptions: set[str] = set()
        self.registered = False
        self.clean_exit = False
        # Deliveries may go out: a module's at once (its inputs), a device's once it subscribed to its device-bound
        # topic (IoT Hub sends cloud-to-device messages only then; the Azure SDK subscribes after connecting).
        self.listening = True
        # topic -> (system, application properties) of a telemetry PUBLISH without MQTT 5 properties that the
        # ACL allowed: the same topic gives the same properties, so later ones skip parsing and checking it.
        # Bounded in bytes; only topics the ACL allowed and that made a message are kept.
        self._telemetry: BudgetDict[str, tuple[Mapping[str, str], Mapping[str, str | None]]] = BudgetDict(
            self.settings.topic_cache_bytes
        )
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()  # the ingest groups in flight
        self.calls = ModuleCalls(self.hub, now=self.settings.clock.time)  # the direct method calls it made
        self.children = Children()  # the devices behind it, when it is a child hub
        # Refill the delivery window once a quarter of it is free: a client acks a few messages per read, and
        # refilling two or three slots at a time cost a socket write each; the rest is still in flight, so the
        # client never waits for it, and a window that drains completely is always refilled.
        self._refill_at = max(1, self.settings.outbound_window // 4)

    @property
    def awaiting_acks(self) -> bool:
        """Deliveries to this client wait for its acks."""
        return bool(self.link.pending)

    async def open(self) -> list[Event] | None:
        """Read CONNECT and authenticate: the events of what the client pipelined after CONNECT once accepted,
        None when the connection ended or was refused (the refusal is flushed)."""
        while True:
            data = await self.sock.read()
            if not data:
                return None
            for event in self.conn.receive_data(data):
                if isinstance(event, ProtocolFailed):
                    self.protocol_failed(event)
                    self.sock.flush()
                    return None
                if isinstance(event, ConnectRequested):
                    return await self._authenticate(event.connect)

    def claimed(self) -> str | None:
        """The client id the client claimed, fit for a log line; None before CONNECT."""
        c = self.conn.connect
        return shown(c.client_id) if c is not None else None

    def on_data(self, data: bytes) -> None:
        """One read of a live connection."""
        conn = self.conn
        if self.link.pending:
            # A read of nothing but PUBACKs (most reads of a module that is being delivered to) needs no events.
            acked = conn.receive_acks(data)
            if acked is not None:
                self._delivered(acked)
                return
        self.dispatch(conn.receive_data(data))
        if conn.closed:
            self.sock.finish()

    def _delivered(self, packet_ids: list[int], refused: Container[int] = ()) -> None:
        """Settle the deliveries these acks answer (by packet id; ``refused``: those the client refused), then
        refill the window if it is time."""
        identity = self.identity
        if identity is None:
            return
        pending = self.link.pending
        outcomes: list[tuple[int, bool]] = []
        acked = False
        for packet_id in packet_ids:
            delivery_id = pending.pop(packet_id, None)
            if delivery_id is not None:
                outcomes.append((delivery_id, packet_id not in refused))
            elif self.children.links and self.children.acked(self.hub, packet_id, packet_id not in refused):
                acked = True  # a delivery for a device behind this child hub (children.py)
        if outcomes:
            self.hub.delivered_many(identity, outcomes)  # one call for the read's acks, not one per ack
            acked = True
        # The connection's window, not the link's: a child hub's own link may not listen while its devices' do.
        if acked and self.conn.window_free >= self._refill_at:
            self.hub.link_ready(identity, self.link)
            self.children.refill(self.hub)

    async def _authenticate(self, c: Connect) -> list[Event] | None:
        # Throttled per source address and per (address, claimed client id): LoginThrottle says why.
        keys = (self.sock.address, c.client_id)
        server = self.server
        if server.logins.blocked(*keys):
            self.sock.refused(RefusalReason.LOGIN_THROTTLED, client=shown(c.client_id))
            self.conn.refuse(ReasonCode.CONNECTION_RATE_EXCEEDED, reason="too many failed logins; try again later")
            self.sock.flush()
            return None
        if c.properties.get_str(PropertyId.AUTHENTICATION_METHOD) is not None:
            return self._refuse(keys, ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not offered", c)
        try:
            claimed = parse_client_id(c.client_id)
        except ValueError:
            return self._refuse(keys, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "client id is not deviceId[/moduleId]", c)
        if c.username is not None:
            # IoT Hub's form, {host}/{device}[/{module}][/?api-version=...], or the client id itself; it must name
            # the identity the client id claims (a username was ignored unless it had "/?" in it).
            try:
                named = username_identity(c.username, c.client_id)
            except ValueError:
                return self._refuse(keys, ReasonCode.BAD_USERNAME_OR_PASSWORD, "malformed username", c)
            if named != claimed:
                return self._refuse(keys, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "username and client id disagree", c)
        thumbprint, cn, verified = self.sock.peer_certificate()
        creds = Credentials(claimed, c.username, c.password, thumbprint, cn, verified)
        try:
            result = await self.server.authenticate(creds)  # checked again if a revocation overlapped it
        except AuthenticationError as exc:
            return self._refuse(keys, ReasonCode.NOT_AUTHORIZED, "authentication failed", c, detail=exc)
        if result.identity != claimed:
            return self._refuse(
                keys, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "client id is not the authenticated identity", c
            )
        server.logins.succeeded(*keys)
        self.sock.authenticated(result.identity.id)
        self.identity = result.identity
        self.auth_method = result.auth_method
        self.listening = result.identity.module_id is not None
        old = self.server.claim_identity(self.identity.id, self)
        if old is not None:
            self.server.events.line(self.identity.id, "mqtt.session_takeover", client=self.identity)
            old.take_over()
        info = await self.hub.connect(self.identity, self.link, clean_session=c.clean_start)
        self.registered = True
        pipelined = self.conn.accept(session_present=info.session_present)
        self.sock.flush()
        self.server.events.line(
            self.identity.id, "mqtt.connected", client=self.identity, level=c.protocol_level, auth=self.auth_method
        )
        self.hub.link_ready(self.identity, self.link)
        return pipelined

    def _refuse(
        self, keys: tuple[str, str], reason: int, text: str, c: Connect, *, detail: object = None
    ) -> list[Event] | None:
        """Refuse the login: a failing CONNACK with ``reason`` and ``text``, counted by the login throttle. None,
        as ``_authenticate`` returns for a refusal."""
        self.server.logins.failed(*keys)
        why = _LOGIN_REFUSALS.get(reason, RefusalReason.BAD_CREDENTIALS)
        extra = {"detail": shown(str(detail), 200)} if detail is not None else {}
        self.sock.refused(why, client=shown(c.client_id), why=repr(text), **extra)
        self.conn.refuse(reason, reason=text)
        self.sock.flush()
        return None

    def protocol_failed(self, event: ProtocolFailed) -> None:
        error = event.error
        too_large = error.reason_code == ReasonCode.PACKET_TOO_LARGE
        why = RefusalReason.PACKET_TOO_LARGE if too_large else RefusalReason.MALFORMED_PACKET
        code = error.reason_code if error.reason_code is not None else ReasonCode.PROTOCOL_ERROR
        self.sock.refused(why, client=self.claimed(), code=f"0x{code:02x}", detail=shown(str(error), 200))

    def take_over(self) -> None:
        """A newer connection of the same identity won: say so and close."""
        self.conn.close(ReasonCode.SESSION_TAKEN_OVER)
        self.clean_exit = True  # a takeover does not publish the will [MQTT-3.1.4-3 notwithstanding, as IoT Hub]
        self.sock.finish()
        self.sock.close()

    def revoke(self) -> None:
        """The identity's credentials were removed or rotated: close now, without the will."""
        log.info("mqtt.identity_revoked client=%s", self.identity)
        self.conn.close(ReasonCode.ADMINISTRATIVE_ACTION)
        self.clean_exit = True
        self.sock.finish()
        self.sock.close()

    def dispatch(self, events: list[Event]) -> None:
        group: list[MessageReceived] = []
        acked: list[int] = []
        refused: set[int] = set()
        for event in events:
            if isinstance(event, MessageReceived):
                group.append(event)
            elif isinstance(event, SubscribeRequested):
                self._on_subscribe(event)
            elif isinstance(event, UnsubscribeRequested):
                self._on_unsubscribe(event)
            elif isinstance(event, DeliveryAcked):
                acked.append(event.packet_id)
                if event.reason_code >= 0x80:
                    refused.add(event.packet_id)
            elif isinstance(event, Disconnected):
                self.clean_exit = not event.publish_will
            elif isinstance(event, ProtocolFailed):
                self.protocol_failed(event)  # the connection is closed; run() ends after flushing the goodbye
        if acked:
            self._delivered(acked, refused)
        if group:
            self.sock.group_started()
            task = self._loop.create_task(self._ingest(group), name=f"mqtt.ingest {self.identity}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.sock.flush()

    def _on_subscribe(self, event: SubscribeRequested) -> None:
        assert self.identity is not None
        s = self.settings
        codes: list[int] = []
        for sub in event.subscribe.subscriptions:
            f = sub.topic_filter
            if len(f) > s.max_filter_length or len(f.encode()) > s.max_filter_length:
                self.sock.refused(RefusalReason.FILTER_TOO_LONG, length=len(f.encode()), limit=s.max_filter_length)
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
            elif (  # a gateway's filters for the devices behind it are bounded by the identities, not counted here
                f not in self.subscriptions
                and len(self.subscriptions) >= s.max_subscriptions
                and Children.child_of(self.hub, self.identity, f) is None
            ):
                self.sock.refused(RefusalReason.TOO_MANY_SUBSCRIPTIONS, filter=shown(f), limit=s.max_subscriptions)
                codes.append(ReasonCode.QUOTA_EXCEEDED)
            elif s.acl.may_subscribe(self.identity, f) or self.children.stand_in(self, f):
                self.subscriptions.add(f)
                codes.append(min(sub.qos, 1))
            else:
                self.sock.refused(RefusalReason.NOT_AUTHORIZED, subscribe=shown(f))
                codes.append(ReasonCode.NOT_AUTHORIZED)
        self.conn.answer_subscribe(event.subscribe.packet_id, codes)
        devicebound = f"devices/{self.identity.device_id}/messages/devicebound/x"  # one of its device-bound topics
        if not self.listening and any(topic_matches(f, devicebound) for f in self.subscriptions):
            self.listening = True
            self.hub.link_ready(self.identity, self.link)  # what waited for the device goes out now

    def _on_unsubscribe(self, event: UnsubscribeRequested) -> None:
        codes: list[int] = []
        for f in event.unsubscribe.topic_filters:
            codes.append(ReasonCode.SUCCESS if f in self.subscriptions else ReasonCode.NO_SUBSCRIPTION_EXISTED)
            self.subscriptions.discard(f)
        self.conn.answer_unsubscribe(event.unsubscribe.packet_id, codes)

    async def _ingest(self, group: list[MessageReceived]) -> None:
        try:
            await self._ingest_group(group)
        except StoreError as exc:
            # The store's failure, not this client's: one key for the hub, so a thousand clients log a few lines.
            self.server.events.warning("ingest_failed", "mqtt.ingest_failed", client=self.identity, detail=exc)
            code, text = STORE_FAILED
            self.conn.close(code, reason=text)
            self.sock.finish()
            self.sock.close()
        finally:
            self.sock.group_done()

    async def _ingest_group(self, group: list[MessageReceived]) -> None:
        identity = self.identity
        assert identity is not None
        now = self.settings.clock.time()
        # Per message, in arrival order: its ticket, and either its index in to_store (the hub answers it) or the
        # reason code and Reason String of the answer made here.
        settle: list[tuple[int | None, int | None, int, str | None]] = []
        to_store: list[Message] = []
        known = self._telemetry
        for event in group:
            p = event.publish
            props = known.get(p.topic)
            if props is not None and p.properties is NO_PROPERTIES:
                # A telemetry topic this client used before: its properties are known.
                settle.append((event.ticket, len(to_store), 0, None))
                to_store.append(Message(p.payload, props[1], props[0]))
                continue
            if props is None:
                twin = parse_twin_request(p.topic)
                if twin is not None:
                    await self._on_twin(identity, twin, p)
                    settle.append((event.ticket, None, 0, None))
                    continue
                if p.topic.startswith("$iothub/") and len(p.topic) <= self.settings.max_topic_length:
                    # A method call or answer (methods.py): never a message.
                    answer = self.calls.on_publish(identity, p.topic, p.payload, self.respond, self.sock.refused)
                    if answer is not None:
                        settle.append((event.ticket, None, *answer))
                        continue
                refusal = self._publish_refusal(identity, p.topic)
                if refusal is not None:
                    settle.append((event.ticket, None, *refusal))
                    continue
            try:
                msg = self._message(identity, p, now, props)
            except InvalidMessageError as exc:
                code = REJECT_REASONS.get(exc.reason, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
                self.sock.refused(exc.reason, topic=shown(p.topic), detail=shown(str(exc), 200))
                settle.append((event.ticket, None, code, None))
                continue
            settle.append((event.ticket, len(to_store), 0, None))
            to_store.append(msg)
            if props is None and isinstance(parse_publish_topic(p.topic), TelemetryTopic):
                # Without MQTT 5 properties a message's properties follow from the topic alone (the identity
                # and auth method are the connection's): later messages on it share these (immutable) maps.
                # Only the client's own telemetry topics, which the ACL always allows: a topic a grant allowed
                # is checked every time, so a deployment that withdraws the grant stops it at the next PUBLISH.
                if p.properties is not NO_PROPERTIES:
                    msg = self._message(identity, msgspec.structs.replace(p, properties=NO_PROPERTIES), now, None)
                known.remember(p.topic, (msg.system_properties, msg.properties), _ENTRY_OVERHEAD + 3 * len(p.topic))
        try:
            outcomes = await self.hub.ingest(identity, to_store) if to_store else []
        except StorageIOError:
            # The disk refused the group's write and the store stays usable (the store logged why; edgehub.hub's
            # contract): a refusal of these messages, as for any other, not of the connection.
            outcomes = [STORE_UNAVAILABLE] * len(to_store)
        answers: list[tuple[int, int, str | None]] = []
        for ticket, index, reason, text in settle:
            outcome = outcomes[index] if index is not None else None
            if isinstance(outcome, Rejected):
                reason = REJECT_REASONS.get(outcome.reason, ReasonCode.UNSPECIFIED_ERROR)
                text = outcome.detail or None
                self.sock.refused(outcome.reason, qos=0 if ticket is None else 1, code=f"0x{reason:02x}")
            if ticket is None:
                continue  # QoS 0: nothing to answer (a refusal was logged where it was made)
            answers.append((ticket, reason, text))
        if answers:
            self.conn.settle_many(answers)
        self.sock.flush()
        if self.conn.closed:
            self.sock.finish()
            self.sock.close()

    def _publish_refusal(self, identity: Identity, topic: str) -> tuple[int, str] | None:
        """Why a PUBLISH on ``topic`` (not a twin request, not known) is refused, logged; None if it is not."""
        limit = self.settings.max_topic_length
        if len(topic) > limit:
            self.sock.refused(RefusalReason.TOPIC_TOO_LONG, length=len(topic), limit=limit)
            return ReasonCode.TOPIC_NAME_INVALID, f"topic name over {limit} characters"
        if not self.settings.acl.may_publish(identity, topic):
            self.sock.refused(RefusalReason.NOT_AUTHORIZED, topic=shown(topic))
            return ReasonCode.NOT_AUTHORIZED, "not authorized to publish on this topic"
        return None

    def _message(
        self,
        identity: Identity,
        p: Publish,
        now: float,
        base: tuple[Mapping[str, str], Mapping[str, str | None]] | None,
    ) -> Message:
        props = p.properties
        return message_from_publish(
            identity,
            p.topic,
            p.payload,
            auth_method=self.auth_method,
            now_s=now,
            content_type=props.get_str(PropertyId.CONTENT_TYPE),
            correlation_data=props.get_bytes(PropertyId.CORRELATION_DATA),
            message_expiry_s=props.get_int(PropertyId.MESSAGE_EXPIRY_INTERVAL),
            user_properties=props.user,
            base=base,
        )

    async def _on_twin(self, identity: Identity, twin: TwinRequest, p: Publish) -> None:
        if twin.operation == "GET":
            doc: Mapping[str, Any] = await self.hub.get_twin(identity)
            self.respond(twin_response_topic(200, twin.rid), json.dumps(doc).encode())
            return
        try:
            # The hub parses the raw patch (edgehub.hub.twins): bounded size and depth before any json.loads.
            version = await self.hub.update_reported(identity, p.payload)
        except TwinError as exc:  # refused and logged by the hub; the device gets IoT Hub's status
            self.respond(twin_response_topic(exc.status, twin.rid), b"")
            return
        self.respond(twin_response_topic(204, twin.rid, version=version), b"")

    def respond(self, topic: str, payload: bytes) -> None:
        """A QoS 0 answer on ``topic`` (a twin's, a method call's, a desired-properties patch), if the client
        subscribed to it; flushed at the end of this turn of the event loop."""
        if self.conn.closed or not any(topic_matches(f, topic) for f in self.subscriptions):
            return
        self.conn.send_message(topic, payload, qos=0)
        self.sock.schedule_flush()  # an answer made outside a read (a method call's) goes out too

    async def _publish_will(self, identity: Identity) -> None:
        c = self.conn.connect
        if self.clean_exit or c is None or c.will is None:
            return
        will = c.will
        if not self.settings.acl.may_publish(identity, will.topic):
            # A will the client may not publish is refused like its PUBLISH would be: one line, rate-limited.
            self.sock.refused(RefusalReason.NOT_AUTHORIZED, client=identity.id, will=shown(will.topic))
            return
        try:
            msg = message_from_publish(
                identity, will.topic, will.payload, auth_method=self.auth_method, now_s=self.settings.clock.time()
            )
            [outcome] = await self.hub.ingest(identity, [msg])
        except IngestRejected as exc:  # a topic the hub cannot take
            self.sock.refused(exc.reason, client=identity.id, will=shown(will.topic), detail=shown(str(exc), 200))
            return
        except EdgeHubError as exc:  # the store failed: not the client's doing
            self.server.events.line(identity.id, "mqtt.will_dropped", client=identity, detail=exc)
            return
        if not isinstance(outcome, Rejected):  # a refusal the hub made it has logged itself
            self.server.events.line(identity.id, "mqtt.will_published", client=identity, topic=will.topic)

    async def close(self) -> None:
        """The connection has ended: let the groups in flight finish, then leave the hub (and publish the will)."""
        self.calls.cancel()
        for task in list(self._tasks):
            if not task.done():
                # Let stores finish: the message may be durable; its ack just cannot go out any more.
                with contextlib.suppress(Exception):
                    await task
        identity = self.identity
        if identity is not None:
            self.server.release_identity(identity.id, self)
        if identity is not None and self.registered:
            await self._publish_will(identity)
            await self.children.close(self.hub)
            await self.hub.disconnect(identity, self.link)

    def cancel(self) -> None:
        """Cancel the groups still in flight (server shutdown)."""
        self.calls.cancel()
        for task in list(self._tasks):
            task.cancel()

    def dispose(self) -> None:
        """Let go of everything that could lead back to this connection (see ``ClientSocket.dispose``)."""
        self.link.detach()  # the hub may hold the link a while longer; it no longer holds this session
        self.children.dispose()  # the same for the links of the devices behind it
        self._tasks.clear()
        self._telemetry.clear()
        del self.sock
