"""The session side of one AMQP connection: what the client is to the hub. It logs the client in (SASL PLAIN with
a SAS token or password, SASL EXTERNAL with its TLS certificate, or SASL ANONYMOUS or no SASL layer and then a SAS
token put on ``$cbs``), answers link attaches by address and ACL, hands each read's transfers to ``Hub.ingest`` as
one group and settles them by the outcome, carries the hub's deliveries out on the client's receiving link
(``_Link``), and serves the twin and method links through ``twin_methods.Channels``.

It never touches the socket: bytes, timers and reading pauses belong to the socket side (``ClientSocket``), which
it sees only as ``SessionSocket`` (``protocol_heads.socket_side``), and its server only as ``HeadServer``, so this
module imports neither the socket module nor the server module, which build it.

Invariants:
* Settled means durable: a transfer is settled ``accepted`` only when ``Hub.ingest`` said ``Stored``; a refusal is
  ``rejected`` with a condition (``refusals.REJECT_CONDITIONS``, the one table). Settlements of a connection go out
  in arrival order (each group waits for the one before it), and each settled transfer gives its link one credit
  back.
* Until the client has an identity, only ``$cbs`` links are served; what it pipelined behind a ``put-token``
  waits (at most ``max_waiting_events``, and transfers of at most ``max_unfinished_bytes_before_login`` bytes) and
  is handled once the token is checked. The connection's other bounds before login are ``AmqpConnection``'s.
* A SAS token's expiry is kept: a connection whose token expires without a new ``put-token`` is closed with
  ``amqp:unauthorized-access``.
* One live connection per identity: a newer one takes over and the older is closed (``amqp:connection:forced``);
  one whose identity's credentials are removed or rotated is closed with ``amqp:unauthorized-access``.
* A module's (or device's) settlement is the checkpoint: ``Hub.delivered`` is called only when the client
  settled; what was unsettled when the link or connection went is redelivered by the hub on the next link. The
  outcome is IoT Hub's: ``accepted`` completes, ``released``/``modified`` abandons (delivered again),
  ``rejected`` dead-letters (``Hub.dead_letter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Coroutine
from typing import Any

from proton import Link
from proton import Message as AmqpMessage

from edgehub.core import (
    AuthenticationError,
    DeliveryError,
    FailureKind,
    Identity,
    InvalidMessageError,
    Message,
    StorageIOError,
    StoreError,
)
from edgehub.core.logtext import shown
from edgehub.core.refusals import RefusalReason
from edgehub.core.sas import parse_sas_token
from edgehub.hub import STORE_UNAVAILABLE, Credentials, Rejected
from edgehub.hub import Delivery as HubDelivery
from protocol_heads.amqp import events as ev
from protocol_heads.amqp.connection import (
    NOT_ALLOWED,
    NOT_FOUND,
    RESOURCE_LIMIT,
    UNAUTHORIZED,
    AmqpConnection,
    PeerMessageTooLarge,
)
from protocol_heads.amqp.iothub import (
    AddressKind,
    amqp_from_message,
    cbs_response,
    identity_of_audience,
    parse_address,
    parse_cbs_request,
    parse_plain_username,
)
from protocol_heads.amqp.refusals import STORE_FAILED, UNDECODABLE, rejection_condition
from protocol_heads.amqp.sasl import SaslCode, SaslInit
from protocol_heads.amqp.settings import AmqpSettings
from protocol_heads.amqp.transfers import TransferDecoder
from protocol_heads.amqp.twin_methods import Channels
from protocol_heads.listeners import HeadServer
from protocol_heads.socket_side import SessionSocket

__all__ = ["Session"]

log = logging.getLogger(__name__)

_FORCED = "amqp:connection:forced"


class _Link:
    """The ``ClientLink`` the hub sends deliveries through: the client's receiving link, once attached."""

    def __init__(self, session: Session) -> None:
        self._session: Session | None = session
        self.link: Link | None = None  # proton's outgoing link, once the client attached it
        self.input_kind: AddressKind | None = None
        self.pending: dict[str, int] = {}  # delivery tag → hub delivery id
        self._tags = itertools.count(1)

    def detach(self) -> None:
        """The session let go of this link (a relink, or the connection disposed of): hold nothing of it."""
        self._session = None

    @property
    def window_free(self) -> int:
        session, link = self._session, self.link
        if session is None or link is None or session.conn.closed:
            return 0
        free: int = min(session.settings.outbound_window - len(self.pending), link.credit)
        return max(0, free)

    relays_modules = False  # edgehub.hub.methods.MethodLink: it is the client's own link

    def send_desired_patch(self, patch: bytes, version: int) -> None:
        """``TwinLink``: over the client's twin link, if it subscribed to desired-property patches."""
        if self._session is not None:
            self._session.channels.send_desired_patch(patch, version)

    def send_method_request(self, rid: str, name: str, payload: bytes, target: Identity) -> bool:
        """``MethodLink``: over the client's method link, if it attached one and gave credit."""
        session = self._session
        return session is not None and session.channels.send_method_request(rid, name, payload)

    def send(self, delivery: HubDelivery) -> None:
        session, link = self._session, self.link
        if session is None or link is None or session.conn.closed:
            raise DeliveryError("client is not connected", endpoint="amqp", kind=FailureKind.TRANSIENT)
        if link.credit <= 0:
            raise DeliveryError("no link credit", endpoint=session.sock.peer, kind=FailureKind.TRANSIENT)
        input_name = delivery.input_name if self.input_kind == AddressKind.MODULE_INPUTS else None
        payload = amqp_from_message(delivery.message, input_name=input_name, redelivery=delivery.redelivery).encode()
        tag = str(next(self._tags))
        try:
            session.conn.send(link, tag, payload)
        except PeerMessageTooLarge as exc:
            raise DeliveryError(
                f"cannot be sent over AMQP: {exc}", endpoint=session.sock.peer, kind=FailureKind.PERMANENT
            ) from exc
        self.pending[tag] = delivery.delivery_id
        session.sock.schedule_flush()


class Session:
    """The session side of one connection (module docstring); ``sock`` is its socket side."""

    def __init__(self, server: HeadServer[AmqpSettings, Session], sock: SessionSocket, conn: AmqpConnection) -> None:
        self.server = server
        self.hub = server.hub
        self.settings = server.settings
        self.sock = sock
        self.conn = conn
        self.identity: Identity | None = None
        self.auth_method = ""
        self.link = _Link(self)
        self.registered = False
        self.logged_in: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._telemetry: set[str] = set()  # names of the accepted incoming telemetry links
        self._cbs_in: set[str] = set()  # names of incoming $cbs links
        self._cbs_out: Link | None = None
        # Answers made before the client gave its $cbs link credit (an SDK may attach it, send its put-token and
        # only then flow): sent on its first credit. At most one per put-token in progress, and those are bounded.
        self._cbs_unsent: list[bytes] = []
        self._authenticating = False  # a put-token is being checked: other events wait (_waiting)
        self._waiting: list[ev.Event] = []
        self._waiting_bytes = 0  # of the transfers in _waiting, while the client has no identity
        self._last_group: asyncio.Future[None] | None = None  # settled when the latest group has been answered
        self._expiry: asyncio.Task[None] | None = None  # closes the connection when its token expires
        self._expiry_s: int | None = None
        self._transfers = TransferDecoder()  # one per connection: it keeps what the last message's sections gave
        self.channels = Channels(self)  # the twin and method links (twin_methods.py)

    # --- input ------------------------------------------------------------------------------------------------

    def on_data(self, data: bytes) -> None:
        self.dispatch(self.conn.receive_data(data))

    def dispatch(self, events: list[ev.Event]) -> None:
        group: list[ev.MessageReceived] = []
        acked = False
        for event in events:
            if self._authenticating and not self._serves_cbs(event):
                if len(self._waiting) >= self.settings.max_waiting_events:
                    self._fail(RefusalReason.TOO_MANY_LINKS, RESOURCE_LIMIT, "too much sent before the token's check")
                    break
                if isinstance(event, ev.MessageReceived) and self.identity is None:
                    # Transfers held for the token's check are a stranger's bytes too: the same bound as proton's.
                    self._waiting_bytes += len(event.body)
                    limit = self.settings.max_unfinished_bytes_before_login
                    if self._waiting_bytes > limit:
                        self._fail(
                            RefusalReason.TOO_MUCH_BEFORE_LOGIN,
                            RESOURCE_LIMIT,
                            f"over {limit:,} unfinished bytes before login",
                        )
                        break
                self._waiting.append(event)
                continue
            if isinstance(event, ev.MessageReceived):
                if event.link_name in self._cbs_in:
                    self._on_cbs(event)
                elif event.link_name in self._telemetry:
                    group.append(event)
                elif self.channels.serves(event.link_name):
                    self.channels.on_message(event)
                else:
                    self.conn.settle(event.delivery, NOT_ALLOWED, "not a telemetry link")
            elif isinstance(event, ev.DeliveryUpdated):
                acked |= self._delivered(event)
            elif isinstance(event, ev.CreditAdded):
                if event.link is self.link.link or self._is_delivery_link(event.link):
                    acked = True
                elif self._cbs_out is not None and event.link.name == self._cbs_out.name:
                    self._send_cbs_answers()
                else:
                    self.channels.credit_added(event.link)
            elif isinstance(event, ev.LinkRequested):
                self._on_link(event)
            elif isinstance(event, ev.LinkClosed):
                self._on_link_closed(event.link)
            elif isinstance(event, ev.MessageTooLarge):
                self.sock.refused(RefusalReason.MESSAGE_TOO_LARGE, size=event.size, limit=event.limit)
            elif isinstance(event, ev.SaslInitReceived):
                self._spawn(self._sasl_login(event.init), "amqp.login")
            elif isinstance(event, ev.ProtocolFailed):
                why = RefusalReason.PACKET_TOO_LARGE if event.too_large else RefusalReason.MALFORMED_PACKET
                if event.before_login is not None:
                    why = RefusalReason.TOO_MUCH_BEFORE_LOGIN
                elif event.condition == RESOURCE_LIMIT:
                    why = RefusalReason.TOO_MANY_LINKS
                self.sock.refused(why, condition=event.condition, detail=shown(event.description, 200))
                self.sock.finish()
            elif isinstance(event, ev.Closed):
                self.sock.finish()
        if group:
            self.sock.group_started()
            self._spawn(self._ingest(group), "amqp.ingest")
        if acked and self.identity is not None and self.registered:
            self.hub.link_ready(self.identity, self.link)
        self.sock.flush()

    def _serves_cbs(self, event: ev.Event) -> bool:
        if isinstance(event, ev.LinkRequested):
            return event.address == "$cbs"
        if isinstance(event, ev.MessageReceived):
            return event.link_name in self._cbs_in
        return not isinstance(event, ev.LinkClosed | ev.DeliveryUpdated | ev.CreditAdded)

    # --- what Channels asks of its session (twin_methods.ChannelsSession) ---------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._spawn(coro, name)

    def _is_delivery_link(self, link: Link) -> bool:
        own = self.link.link
        return own is not None and link.is_sender and link.name == own.name

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = self._loop.create_task(coro, name=f"{name} {self.sock.peer}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fail(self, why: RefusalReason, condition: str, text: str, expiry_s: int | None = None) -> None:
        """Refuse the connection: log (with the token's expiry, or else ``text``), close with ``condition`` and
        end."""
        if expiry_s is not None:
            self.sock.refused(why, condition=condition, expiry_s=expiry_s)
        else:
            self.sock.refused(why, condition=condition, detail=text)
        self.conn.close(condition, text)
        self.sock.finish()

    # --- login --------------------------------------------------------------------------------------------

    def claimed(self) -> str | None:
        init = self.conn.sasl.init
        return shown(init.mechanism) if init is not None and self.identity is None else self.sock.client_id

    async def _sasl_login(self, init: SaslInit) -> None:
        if init.mechanism == "ANONYMOUS":
            self._answer_sasl(SaslCode.OK)  # the identity comes with a put-token on $cbs
            return
        thumbprint, cn, verified = self.sock.peer_certificate()
        try:
            if init.mechanism == "PLAIN":
                _authzid, _, rest = init.response.partition(b"\x00")
                authcid, sep, password = rest.partition(b"\x00")
                if not sep:
                    raise ValueError("PLAIN response is not authzid NUL authcid NUL password")
                identity = parse_plain_username(authcid.decode("utf-8"))
                creds = Credentials(identity, authcid.decode("utf-8"), password)
            else:  # EXTERNAL: the certificate says who; the response may name the identity it claims
                name = init.response.decode("utf-8") or (cn or "")
                identity = parse_plain_username(name)
                password = b""
                creds = Credentials(identity, None, None, thumbprint, cn, verified)
        except (ValueError, UnicodeDecodeError) as exc:
            self._answer_sasl(SaslCode.AUTH)
            self.sock.refused(RefusalReason.BAD_USERNAME, mechanism=init.mechanism, detail=shown(str(exc), 200))
            return
        if await self._authenticate(creds):
            self._answer_sasl(SaslCode.OK)
            self._token_expiry(password)
        else:
            self._answer_sasl(SaslCode.AUTH)

    def _answer_sasl(self, code: SaslCode) -> None:
        if self.conn.closed:
            return
        self.dispatch(self.conn.sasl_outcome(code))
        if code != SaslCode.OK:
            self.sock.finish()

    async def _authenticate(self, creds: Credentials) -> bool:
        """Ask the hub; on success the connection is this identity's (taking over an older one)."""
        server = self.server
        keys = (self.sock.address, creds.identity.id)
        if server.logins.blocked(*keys):
            self.sock.refused(RefusalReason.LOGIN_THROTTLED, client=shown(creds.identity.id))
            return False
        if self.identity is not None and creds.identity != self.identity:
            self.sock.refused(RefusalReason.NOT_AUTHORIZED, client=shown(creds.identity.id), why="second identity")
            return False
        try:
            result = await server.authenticate(creds)  # checked again if a revocation overlapped it
        except AuthenticationError as exc:
            server.logins.failed(*keys)
            self.sock.refused(RefusalReason.BAD_CREDENTIALS, client=shown(creds.identity.id), detail=shown(str(exc)))
            return False
        server.logins.succeeded(*keys)
        if self.identity is not None:
            return True  # a renewal
        self.identity = result.identity
        self.auth_method = result.auth_method
        self.conn.logged_in()
        self.sock.authenticated(result.identity.id)
        old = server.claim_identity(result.identity.id, self)
        if old is not None:
            server.events.line(result.identity.id, "amqp.session_takeover", client=result.identity)
            old.take_over()
        await self.hub.connect(result.identity, self.link, clean_session=False)
        self.registered = True
        if not self.logged_in.done():
            self.logged_in.set_result(None)
        server.events.line(result.identity.id, "amqp.connected", client=result.identity, auth=result.auth_method)
        return True

    def _token_expiry(self, password: bytes) -> None:
        """Close the connection when its SAS token expires (unless a put-token renews it first)."""
        if not password.startswith(b"SharedAccessSignature "):
            return
        try:
            expiry_s = parse_sas_token(password.decode("utf-8", errors="replace")).expiry_s
        except AuthenticationError:
            return
        self._expiry_s = expiry_s
        if self._expiry is not None:
            self._expiry.cancel()
        # On the settings' clock (a test steers it), as the hub checks the token's expiry on its own.
        self._expiry = self._loop.create_task(self._token_expires(expiry_s), name=f"amqp.token {self.sock.peer}")

    async def _token_expires(self, expiry_s: int) -> None:
        clock = self.settings.clock
        while clock.time() < expiry_s:
            await clock.sleep(expiry_s - clock.time())
        if self._expiry_s == expiry_s and not self.conn.closed:
            self._fail(RefusalReason.TOKEN_EXPIRED, UNAUTHORIZED, "the SAS token expired", expiry_s=expiry_s)

    def _on_cbs(self, event: ev.MessageReceived) -> None:
        try:
            message = AmqpMessage()
            message.decode(event.body)
            request = parse_cbs_request(message)
            identity = identity_of_audience(request.audience)
        except Exception as exc:  # proton's decode errors, and ours
            self.sock.refused(RefusalReason.BAD_CREDENTIALS, why="bad put-token", detail=shown(str(exc), 200))
            self.conn.settle(event.delivery, NOT_ALLOWED, "not a SAS put-token")
            return
        self.conn.settle(event.delivery)
        self.conn.give_credit(event.link, 1)
        self._authenticating = True
        creds = Credentials(identity, None, request.token.encode())

        async def check() -> None:
            try:
                ok = await self._authenticate(creds)
            finally:
                self._authenticating = False
            if ok:
                self._token_expiry(creds.password or b"")
            self._cbs_answer(request.message_id, 200 if ok else 401, "OK" if ok else "Unauthorized", request.reply_to)
            waiting, self._waiting = self._waiting, []
            self._waiting_bytes = 0
            if waiting and not self.conn.closed:
                self.dispatch(waiting)
            self.sock.flush()

        self._spawn(check(), "amqp.cbs")

    def _cbs_answer(self, request_id: object, status: int, text: str, reply_to: str | None) -> None:
        if len(self._cbs_unsent) < self.settings.max_waiting_events:
            self._cbs_unsent.append(cbs_response(request_id, status, text, reply_to).encode())
        self._send_cbs_answers()

    def _send_cbs_answers(self) -> None:
        link = self._cbs_out
        while self._cbs_unsent and link is not None and not self.conn.closed and link.credit > 0:
            delivery = self.conn.send(link, "cbs", self._cbs_unsent.pop(0))
            delivery.settle()  # answers are sent settled: nothing to wait for

    def take_over(self) -> None:
        """A newer connection of the same identity won: say so and close."""
        self.conn.close(_FORCED, "a newer connection of this identity took over")
        self.sock.finish()

    def revoke(self) -> None:
        """The identity's credentials were removed or rotated (``HeadServer.close_identity``): close now."""
        log.info("amqp.identity_revoked client=%s", self.identity)
        self.conn.close(UNAUTHORIZED, "the identity's credentials were removed or changed")
        self.sock.finish()

    # --- links ------------------------------------------------------------------------------------------------

    def _on_link(self, event: ev.LinkRequested) -> None:
        link = event.link
        address = parse_address(event.address, outgoing=event.outgoing)
        if address is None:
            self.sock.refused(RefusalReason.UNKNOWN_ADDRESS, address=shown(event.address))
            self.conn.refuse_link(link, NOT_FOUND, "no such node")
            return
        if address.kind == AddressKind.CBS:
            if event.outgoing:
                self._cbs_out = link
                self.conn.accept_link(link)
            else:
                self._cbs_in.add(link.name)
                self.conn.accept_link(link, credit=2)
            return
        if self.identity is None or address.identity != self.identity:
            self.sock.refused(RefusalReason.NOT_AUTHORIZED, address=shown(event.address))
            self.conn.refuse_link(link, UNAUTHORIZED, "not this connection's identity")
            return
        if address.kind == AddressKind.TELEMETRY:
            self._telemetry.add(link.name)
            self.conn.accept_link(link, credit=self.settings.link_credit)
            return
        if address.kind in (AddressKind.TWIN, AddressKind.METHODS):
            self.channels.attach(address.kind, link, outgoing=event.outgoing)
            return
        is_module = self.identity.module_id is not None
        if (address.kind == AddressKind.MODULE_INPUTS) != is_module or self.link.link is not None:
            self.sock.refused(RefusalReason.NOT_AUTHORIZED, address=shown(event.address), why="delivery link")
            self.conn.refuse_link(link, NOT_ALLOWED, "one delivery link per connection, of this identity's kind")
            return
        self.conn.accept_link(link)
        self.link.link = link
        self.link.input_kind = address.kind
        # Deliveries start once the client gives credit (CreditAdded).

    def _on_link_closed(self, link: Link) -> None:
        if self.channels.link_closed(link):
            return
        if link.is_receiver:
            self._telemetry.discard(link.name)
            self._cbs_in.discard(link.name)
            return
        if self._cbs_out is not None and link.name == self._cbs_out.name:
            self._cbs_out = None
        elif self._is_delivery_link(link) and self.identity is not None:
            # The client let go of its inputs: what it had not settled comes again on its next link.
            old, identity = self.link, self.identity
            self.link = _Link(self)
            old.detach()

            async def relink() -> None:
                await self.hub.disconnect(identity, old)
                if not self.conn.closed:
                    await self.hub.connect(identity, self.link, clean_session=False)

            self.registered = False
            self._spawn(self._registered_after(relink()), "amqp.relink")

    async def _registered_after(self, coro: Coroutine[Any, Any, None]) -> None:
        await coro
        self.registered = not self.conn.closed

    def _delivered(self, event: ev.DeliveryUpdated) -> bool:
        if not self._is_delivery_link(event.link) or self.identity is None:
            return False
        delivery_id = self.link.pending.pop(event.delivery.tag, None)
        if delivery_id is None:
            return False
        if event.rejected:  # IoT Hub's reject: dead-lettered; released (its abandon) and modified come again
            condition = event.delivery.remote.condition
            why = f"rejected by the client: {condition.name}" if condition is not None else "rejected by the client"
            self.hub.dead_letter(self.identity, delivery_id, shown(why, 200))
        else:
            self.hub.delivered(self.identity, delivery_id, event.accepted)
        return True

    # --- ingest -----------------------------------------------------------------------------------------------

    async def _ingest(self, group: list[ev.MessageReceived]) -> None:
        before, done = self._last_group, self._loop.create_future()
        self._last_group = done
        try:
            await self._ingest_group(group, before)
        except StoreError as exc:
            # The store's failure, not this client's: one key for the hub, so a thousand clients log a few lines.
            self.server.events.warning("ingest_failed", "amqp.ingest_failed", client=self.identity, detail=exc)
            self.conn.close(*STORE_FAILED)
            self.sock.finish()
        except Exception:
            # A bug here must not leave the client's transfers unanswered for ever: end this connection only.
            log.exception("amqp.ingest_crashed client=%s", self.identity)
            self.conn.close("amqp:internal-error", "internal error")
            self.sock.finish()
        finally:
            if not done.done():
                done.set_result(None)
            self.sock.group_done()

    async def _ingest_group(self, group: list[ev.MessageReceived], before: asyncio.Future[None] | None) -> None:
        identity = self.identity
        assert identity is not None
        answers: list[tuple[ev.MessageReceived, str | None, str]] = []  # per transfer: condition, text
        slots: list[int | None] = []  # per transfer: its index in to_store
        to_store: list[Message] = []
        for event in group:
            try:
                message = self._transfers.message(identity, event.body, auth_method=self.auth_method)
            except InvalidMessageError as exc:
                self.sock.refused(exc.reason, detail=shown(str(exc), 200))
                answers.append((event, UNDECODABLE, str(exc)))
                slots.append(None)
                continue
            except Exception as exc:  # proton's decode errors: the bytes are not a message
                self.sock.refused(RefusalReason.INVALID_MESSAGE, detail=shown(str(exc), 200))
                answers.append((event, UNDECODABLE, "not an AMQP message"))
                slots.append(None)
                continue
            answers.append((event, None, ""))
            slots.append(len(to_store))
            to_store.append(message)
        try:
            outcomes = await self.hub.ingest(identity, to_store) if to_store else []
        except StorageIOError:
            # The disk refused the group's write and the store stays usable (edgehub.hub's contract): a refusal of
            # each message, which the client may send again, not of the connection.
            outcomes = [STORE_UNAVAILABLE] * len(to_store)
        if before is not None:
            await before  # settlements leave in arrival order
        credit: dict[str, tuple[Link, int]] = {}
        conn = self.conn
        for (event, condition, text), slot in zip(answers, slots, strict=True):
            if slot is not None:
                outcome = outcomes[slot]
                if isinstance(outcome, Rejected):
                    condition, text = rejection_condition(outcome.reason), outcome.detail or str(outcome.reason)
                    self.sock.refused(outcome.reason, condition=condition)
            if not event.settled:
                conn.settle(event.delivery, condition, text)
            link, n = credit.get(event.link_name, (event.link, 0))
            credit[event.link_name] = (link, n + 1)
        for link, n in credit.values():
            conn.give_credit(link, n)
        # The store answers many groups at once (group commit): one write per connection for all of them.
        self.sock.schedule_flush()

    # --- end --------------------------------------------------------------------------------------------------

    async def close(self) -> None:
        """The connection has ended: let the groups in flight finish, then leave the hub."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for task in list(self._tasks):
            if not task.done():
                with contextlib.suppress(Exception):
                    await task
        identity = self.identity
        if identity is not None:
            self.server.release_identity(identity.id, self)
        if identity is not None and self.registered:
            self.registered = False
            await self.hub.disconnect(identity, self.link)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def dispose(self) -> None:
        self.link.detach()
        self.link.link = None
        self._cbs_out = None
        self._cbs_unsent.clear()
        self.channels.clear()
        self._tasks.clear()
        self._waiting.clear()
