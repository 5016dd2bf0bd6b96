"""The server side of one AMQP 1.0 connection, sans-IO: bytes in, ``events`` out; the session side's answers
(accept or refuse a link, settle a transfer, send a message, close) in, bytes out. No sockets, no clocks: time
comes in through ``tick``.

The SASL exchange is ours (``sasl.py`` says why); the AMQP layer after it is proton's engine (``Transport``,
``Connection``, ``Collector``), which frames, decodes performatives, keeps sessions' windows and links' credit,
and which we drive with ``push``/``peek``/``pop``. proton's reactor is never used. A transfer on an incoming link
(the per-message path) is read below proton's Python wrappers, through ``proton_raw``; every other event is wrapped.

Invariants:
* Every bound is enforced here: bytes buffered per session (``session_capacity``, as proton's incoming
  window), frame size (``max_frame_size``, proton refuses a larger frame with
  ``amqp:connection:framing-error``), sessions (``channel_max``), links per connection (``max_links``: more close
  the connection with ``amqp:resource-limit-exceeded``), message size (on incoming links: ``link_message_size``
  asked at each attach, ``max_message_size`` without it, announced then and kept for the link's life). Input is
  handed to proton a frame at a time, so a transfer past its link's limit is seen within a frame of it, however
  large the read; from then on what comes of it is dropped as it comes (``_drop_refused``), and once it has ended
  it is rejected and its link closed with ``amqp:link:message-size-exceeded``.
* Until the session side says the client has logged in (``logged_in``: SASL PLAIN or EXTERNAL, or a ``$cbs`` token
  after ANONYMOUS or with no SASL layer at all, ``sasl.SaslServer.skipped``), tighter bounds hold:
  ``max_sessions_before_login``, ``max_links_before_login`` and ``max_unfinished_bytes_before_login`` (the bytes
  proton holds of transfers not yet whole, over all sessions).
  Past one, the connection is closed with ``amqp:resource-limit-exceeded`` (a ``ProtocolFailed`` whose
  ``before_login`` names the bound): a stranger's connection costs kilobytes, not a session window per session.
* Nothing a client sends raises out of ``receive_data``: malformed input becomes ``ProtocolFailed`` and the
  connection closes with proton's (or our) error condition, which ``data_to_send`` carries out.
* A link is answered once: ``accept_link`` or ``refuse_link``; a refused attach goes back with no terminus and is
  detached with the condition (AMQP 1.0, 2.6.3).
* A message over the max-message-size the client announced on its receiving link is never sent: ``send`` raises
  ``PeerMessageTooLarge`` (it could never go on that link, so the hub dead-letters it rather than retry it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proton import (
    Collector,
    Condition,
    Connection,
    Delivery,
    Disposition,
    Endpoint,
    Event,
    Link,
    Transport,
    symbol,
)

from edgehub.core import LocalProtocolError
from protocol_heads.amqp import events as ev
from protocol_heads.amqp import proton_raw as raw
from protocol_heads.amqp.padding import pad
from protocol_heads.amqp.sasl import SaslCode, SaslError, SaslServer

__all__ = ["AmqpConnection", "PeerMessageTooLarge"]

RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
UNAUTHORIZED = "amqp:unauthorized-access"
NOT_ALLOWED = "amqp:not-allowed"
NOT_FOUND = "amqp:not-found"
DECODE_ERROR = "amqp:decode-error"


class PeerMessageTooLarge(LocalProtocolError):
    """An outgoing message over the client's max-message-size on its link; it was not sent."""


_WANTED = frozenset(
    kind.number
    for kind in (
        Event.LINK_FLOW,
        Event.LINK_REMOTE_OPEN,
        Event.LINK_REMOTE_CLOSE,
        Event.LINK_REMOTE_DETACH,
        Event.SESSION_REMOTE_OPEN,
        Event.SESSION_REMOTE_CLOSE,
        Event.CONNECTION_REMOTE_OPEN,
        Event.CONNECTION_REMOTE_CLOSE,
        Event.TRANSPORT_ERROR,
        Event.TRANSPORT_TAIL_CLOSED,
        Event.TRANSPORT_CLOSED,
    )
)


def _condition(name: str, description: str) -> Condition:
    # With its info map, so that the error is a list of all three fields: Azure's pure-Python client reads
    # a rejection's error by position (padding.py says more).
    return Condition(name, description, {symbol("condition"): name})


class AmqpConnection:
    """One connection (module docstring). ``closed`` once it has ended, however; the socket goes when
    ``data_to_send`` has given out the goodbye."""

    def __init__(
        self,
        *,
        mechanisms: tuple[str, ...],
        max_frame_size: int,
        max_sessions: int,
        max_links: int,
        max_message_size: int,
        idle_timeout_s: float,
        link_message_size: Callable[[], int] | None = None,
        max_sessions_before_login: int = 2,
        max_links_before_login: int = 8,
        max_unfinished_bytes_before_login: int = 64 * 1024,
        session_capacity: int = 1 << 20,
        container_id: str = "edgehub",
    ) -> None:
        self.sasl = SaslServer(mechanisms)
        self.max_frame_size = max_frame_size
        self.max_sessions = max_sessions
        self.max_links = max_links
        self.max_message_size = max_message_size
        self.link_message_size = link_message_size
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions_before_login = max_sessions_before_login
        self.max_links_before_login = max_links_before_login
        self.max_unfinished_bytes_before_login = max_unfinished_bytes_before_login
        self.before_login = True  # until logged_in(): the bounds before login hold (module docstring)
        self.session_capacity = max(session_capacity, max_frame_size)
        self.container_id = container_id
        self.transport: Transport | None = None
        self.connection: Connection | None = None
        self._collector: Collector | None = None
        self._out = bytearray()
        self._links = 0  # links attached over the connection's life that are still open
        self._sessions = 0  # sessions the client has begun and not ended
        # Incoming links by their pn_link_t, with their names: a transfer names its link without a wrapper.
        self._receivers: dict[Any, tuple[Link, str]] = {}
        self._limits: dict[Any, int] = {}  # incoming links' max-message-size (pn_link_t: as announced at attach)
        # Incoming links (pn_link_t) with a transfer over their limit being dropped: the bytes of it so far.
        self._refused: dict[Any, int] = {}
        self.closed = False
        self.idle_expired = False  # closed by the idle timer (tick)
        self._failed = False

    # --- input -----------------------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[ev.Event]:
        if self.closed or not data:
            return []
        if not self.sasl.done:
            try:
                init = self.sasl.receive_data(data)
            except SaslError as exc:
                self._out += self.sasl.data_to_send()
                self.closed = True
                return [ev.ProtocolFailed(DECODE_ERROR, str(exc))]
            self._out += self.sasl.data_to_send()
            if self.sasl.skipped:  # the plain AMQP header: no SASL layer, the AMQP layer starts with it
                return self._start_amqp()
            return [ev.SaslInitReceived(init)] if init is not None else []
        return self._push(data)

    def sasl_outcome(self, code: SaslCode) -> list[ev.Event]:
        """Answer the client's ``sasl-init``; after OK the AMQP layer starts with what the client pipelined."""
        self.sasl.outcome(code)
        self._out += self.sasl.data_to_send()
        if code != SaslCode.OK:
            self.closed = True
            return []
        return self._start_amqp()

    def _start_amqp(self) -> list[ev.Event]:
        """Hand proton's engine the AMQP layer: what the client sent after SASL (or, with no SASL layer, all)."""
        transport = Transport(Transport.SERVER)
        transport.max_frame_size = self.max_frame_size
        transport.channel_max = max(0, self.max_sessions - 1)
        transport.idle_timeout = self.idle_timeout_s
        connection = Connection()
        connection.container = self.container_id
        # Our open carries its properties (the last of its fields): Azure's pure-Python AMQP client reads the open's
        # fields by position and fails on one whose trailing fields were left off, as proton leaves empty ones.
        connection.properties = {symbol("product"): "edgehub"}
        collector = Collector()
        connection.collect(collector)
        transport.bind(connection)
        self.transport, self.connection, self._collector = transport, connection, collector
        rest, self.sasl.rest = self.sasl.rest, b""
        return self._push(rest) if rest else self._events()

    def _push(self, data: bytes) -> list[ev.Event]:
        transport = self.transport
        assert transport is not None
        view = memoryview(data)
        events: list[ev.Event] = []
        unread = 0  # bytes pushed since the events were last read
        while view:
            capacity = transport.capacity()
            if capacity <= 0:  # the input side has closed (an error, or the client's close): the rest is moot
                break
            # The events are read after each frame's worth: a transfer past its link's limit is refused with at
            # most a frame more of it in proton's hands, however large the read that brought it.
            n = min(capacity, len(view), self.max_frame_size - unread)
            try:
                transport.push(view[:n])  # proton copies from the buffer: no bytes of our own
            except Exception as exc:  # proton raises TransportException for input it cannot take
                self._failed = True
                self.closed = True
                return [*events, *self._events(), ev.ProtocolFailed(DECODE_ERROR, str(exc))]
            view = view[n:]
            unread += n
            if view and unread >= self.max_frame_size:
                events += self._events()
                unread = 0
                if self.closed:  # failed: nothing more of it is read
                    break
        events += self._events()
        if self.before_login and not self._failed:
            unfinished = self._unfinished_bytes()
            if unfinished > self.max_unfinished_bytes_before_login:
                self._over_before_login(events, "unfinished_bytes", self.max_unfinished_bytes_before_login)
        return events

    def logged_in(self) -> None:
        """The client has an identity: from now on the connection's own bounds hold, not those before login."""
        self.before_login = False

    def _unfinished_bytes(self) -> int:
        """What proton holds of incoming transfers (whole ones are read as they arrive: what is left is partial)."""
        total = 0
        session = self.connection.session_head(0) if self.connection is not None else None
        while session is not None:
            total += session.incoming_bytes
            session = session.next(0)
        return total

    def _over_before_login(self, out: list[ev.Event], bound: str, limit: int) -> None:
        """A client not logged in passed ``bound``: close the connection, and nothing more of it is read."""
        description = f"over {limit:,} {bound.replace('_', ' ')} before login"
        self._failed = True
        self.close(RESOURCE_LIMIT, description)
        out.append(ev.ProtocolFailed(RESOURCE_LIMIT, description, before_login=bound))

    def tick(self, now_s: float) -> float:
        """Run the idle timer at monotonic ``now_s``; returns the next deadline (0: none). When the client has sent
        nothing for ``idle_timeout_s``, the connection is ``closed`` and ``idle_expired`` (the close, with
        ``amqp:resource-limit-exceeded`` "local-idle-timeout expired", is ready in ``data_to_send``)."""
        transport = self.transport
        if transport is None or self.closed:
            return 0.0
        deadline = float(transport.tick(now_s))
        if transport.condition is not None and not self._failed:
            # A tick's only error is proton's idle timeout. proton says so only through its collector, which is
            # read after input alone: without this the connection stayed open, its close sent, with no line.
            self._failed = True
            self.closed = True
            self.idle_expired = True
            self._events()  # the transport's error and closes: nothing more to tell
            return 0.0
        return deadline

    def _events(self) -> list[ev.Event]:
        collector = self._collector
        out: list[ev.Event] = []
        if collector is None:
            return out
        impl = raw.handle(collector)
        while True:
            event = raw.next_event(impl)
            if event is None:
                break
            # Only the kinds _translate acts on are wrapped: proton's Event.wrap builds a wrapper for the event's
            # delivery, link, session, connection and transport, and most events (one PN_TRANSPORT per answer,
            # the local and init ones) need none. Transfers take proton_raw's path: no wrapper at all.
            if not self._failed:
                kind = raw.event_type(event)
                try:
                    if kind == raw.PN_DELIVERY:
                        self._delivery(raw.event_delivery(event), out)
                    elif kind in _WANTED:
                        self._translate(Event.wrap(event), out)
                except Exception as exc:
                    # proton decodes a field only when it is read (an address that is not UTF-8 raises
                    # UnicodeDecodeError there): the client sent it, so it is the client's error.
                    self._failed = True
                    self.close(DECODE_ERROR, "a field could not be decoded")
                    out.append(ev.ProtocolFailed(DECODE_ERROR, f"{type(exc).__name__}: {exc}"))
            raw.pop_event(impl)
        return out

    def _delivery(self, delivery: Any, out: list[ev.Event]) -> None:
        """A ``PN_DELIVERY``: a whole transfer on an incoming link is read here, below proton's wrappers; the rest
        (a partial, aborted or too large transfer, an outcome of what the hub sent) goes to ``_unusual``."""
        link = raw.delivery_link(delivery)
        if raw.link_is_receiver(link):
            if self._refused and link in self._refused:
                self._drop_refused(delivery, link, out)
                return
            body = raw.receive_whole(delivery, link, self._limits.get(link, self.max_message_size))
            if body is not None:
                known = self._receivers.get(link)
                if known is None:
                    wrapped = Link.wrap(link)
                    known = self._receivers[link] = (wrapped, wrapped.name)
                settled = bool(raw.delivery_settled(delivery))  # by the peer
                out.append(ev.MessageReceived(known[0], known[1], raw.RawDelivery(delivery), body, settled))
                return
        self._unusual(Delivery.wrap(delivery), out)

    def _unusual(self, delivery: Delivery, out: list[ev.Event]) -> None:
        link = delivery.link
        if link.is_receiver:
            limit = self._limit_of(raw.handle(link))
            if delivery.partial:
                if delivery.pending > limit and link.state & Endpoint.LOCAL_ACTIVE:
                    out.append(ev.MessageTooLarge(link, delivery.pending, limit))
                    self._refused[raw.handle(link)] = 0
                    self._drop_refused(raw.handle(delivery), raw.handle(link), out)
                return
            if not delivery.readable or delivery.aborted:
                if delivery.aborted:
                    delivery.settle()
                return
            # Whole in one frame, still over the limit (receive_whole took every other whole transfer).
            out.append(ev.MessageTooLarge(link, delivery.pending, limit))
            self._reject(delivery, MESSAGE_SIZE_EXCEEDED, "message over the link's max-message-size")
            self._close_link(link, MESSAGE_SIZE_EXCEEDED, "message over the link's max-message-size")
        elif delivery.updated:
            state = delivery.remote_state
            if delivery.settled or state in (
                Disposition.ACCEPTED,
                Disposition.REJECTED,
                Disposition.RELEASED,
                Disposition.MODIFIED,
            ):
                accepted, rejected = state == Disposition.ACCEPTED, state == Disposition.REJECTED
                out.append(ev.DeliveryUpdated(link, delivery, accepted, rejected))
                delivery.settle()
            else:
                delivery.clear()

    def _translate(self, event: Event, out: list[ev.Event]) -> None:
        kind = event.type
        if kind == Event.LINK_FLOW:
            link = event.link
            if link.is_sender and link.state & Endpoint.LOCAL_ACTIVE:
                out.append(ev.CreditAdded(link))
        elif kind == Event.LINK_REMOTE_OPEN:
            link = event.link
            self._links += 1
            if self._links > self.max_links:
                self.close(RESOURCE_LIMIT, f"over {self.max_links} links on one connection")
                out.append(ev.ProtocolFailed(RESOURCE_LIMIT, f"over {self.max_links} links"))
                return
            if self.before_login and self._links > self.max_links_before_login:
                self._over_before_login(out, "links", self.max_links_before_login)
                return
            terminus = link.remote_source if link.is_sender else link.remote_target
            out.append(ev.LinkRequested(link, link.is_sender, terminus.address or ""))
        elif kind in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
            link = event.link
            self._refused.pop(raw.handle(link), None)
            if link.state & Endpoint.LOCAL_ACTIVE:
                self._forget(link)
                link.close()
                self._links -= 1
                out.append(ev.LinkClosed(link))
        elif kind == Event.SESSION_REMOTE_OPEN:
            self._sessions += 1
            if self.before_login and self._sessions > self.max_sessions_before_login:
                self._over_before_login(out, "sessions", self.max_sessions_before_login)
                return
            # What proton buffers of a session's incoming transfers is bounded by its window, which proton
            # derives from this capacity (frames of max_frame_size that fit): a client sends no more until read.
            event.session.incoming_capacity = self.session_capacity
            event.session.open()
        elif kind == Event.SESSION_REMOTE_CLOSE:
            self._sessions -= 1
            session = event.session
            assert self.connection is not None
            link = self.connection.link_head(Endpoint.LOCAL_ACTIVE)
            while link is not None:
                following = link.next(Endpoint.LOCAL_ACTIVE)
                if link.session.state & Endpoint.REMOTE_CLOSED:
                    self._forget(link)
                    link.close()
                    self._links -= 1
                    out.append(ev.LinkClosed(link))
                link = following
            session.close()
        elif kind == Event.CONNECTION_REMOTE_OPEN:
            event.connection.open()
        elif kind == Event.CONNECTION_REMOTE_CLOSE:
            if not self.closed:
                event.connection.close()
                self.closed = True
                out.append(ev.Closed())
        elif kind == Event.TRANSPORT_ERROR:
            if not self._failed:
                self._failed = True
                self.closed = True
                condition = event.transport.condition
                name = condition.name if condition is not None else DECODE_ERROR
                text = condition.description if condition is not None else ""
                out.append(ev.ProtocolFailed(str(name), str(text or ""), too_large="frame" in str(text or "")))
        elif kind in (Event.TRANSPORT_TAIL_CLOSED, Event.TRANSPORT_CLOSED) and not self.closed:
            self.closed = True
            out.append(ev.Closed())

    def _drop_refused(self, delivery: Any, link: Any, out: list[ev.Event]) -> None:
        """A transfer over its link's max-message-size (``pn_delivery_t``, ``pn_link_t``): what comes of it is
        dropped as it comes, so the head never holds more of it than the limit and a frame; once it has ended, it
        is rejected and the link closed, both with ``amqp:link:message-size-exceeded``. Not before: proton's
        client sends the rest of a transfer after a detach, and proton would then answer on a link we have
        detached, by a handle the client no longer knows, so the client would fail. A transfer that goes on for
        more than ``max_message_size`` (the hub's cap) past its link's limit closes the connection: no client is
        owed the time to drop more of it."""
        dropped, ended = raw.drop_read(delivery, link)
        so_far = self._refused[link] + dropped
        if ended:
            del self._refused[link]
            self._reject(Delivery.wrap(delivery), MESSAGE_SIZE_EXCEEDED, "message over the link's max-message-size")
            self._close_link(Link.wrap(link), MESSAGE_SIZE_EXCEEDED, "message over the link's max-message-size")
        elif so_far > self._limit_of(link) + self.max_message_size:
            description = f"a transfer going on {self.max_message_size:,} bytes past its link's max-message-size"
            self._failed = True
            self.close(MESSAGE_SIZE_EXCEEDED, description)
            out.append(ev.ProtocolFailed(MESSAGE_SIZE_EXCEEDED, description, too_large=True))
        else:
            self._refused[link] = so_far

    def _limit_of(self, link: Any) -> int:
        """The max-message-size our end of incoming ``link`` (a ``pn_link_t``) announced; ``max_message_size``
        for a link not attached by ``accept_link``. Kept by us, not asked of proton: this is on every transfer."""
        return self._limits.get(link, self.max_message_size)

    # --- what the session side answers ----------------------------------------------------------------------

    def accept_link(self, link: Link, *, credit: int = 0) -> None:
        """Attach our end of ``link``; an incoming link gets ``credit`` and its max-message-size: what
        ``link_message_size`` says now (``max_message_size`` without it), kept for the link's life."""
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if link.is_receiver:
            size = self.max_message_size if self.link_message_size is None else self.link_message_size()
            link.max_message_size = size
            self._limits[raw.handle(link)] = size
        link.open()
        if link.is_receiver and credit:
            link.flow(credit)

    def refuse_link(self, link: Link, condition: str, description: str) -> None:
        """Answer the attach with no terminus and detach with ``condition``."""
        link.condition = _condition(condition, description)
        link.open()
        self._forget(link)
        link.close()
        self._links -= 1

    def _close_link(self, link: Link, condition: str, description: str) -> None:
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.condition = _condition(condition, description)
            self._forget(link)
            link.close()
            self._links -= 1

    def _forget(self, link: Link) -> None:
        impl = raw.handle(link)
        self._receivers.pop(impl, None)
        self._limits.pop(impl, None)

    def close_link(self, link: Link, condition: str, description: str) -> None:
        self._close_link(link, condition, description)

    def settle(self, delivery: raw.RawDelivery, condition: str | None = None, description: str = "") -> None:
        """``accepted`` (``condition`` None) or ``rejected`` with ``condition``, settled. Once per delivery."""
        if self.connection is None:
            return  # discarded: proton's engine has been let go, and with it whatever was unsettled
        if condition is None:
            raw.accept_and_settle(delivery)
        else:
            self._reject(Delivery.wrap(delivery.impl), condition, description)

    def _reject(self, delivery: Delivery, condition: str, description: str) -> None:
        delivery.local.condition = _condition(condition, description)
        delivery.update(Disposition.REJECTED)
        delivery.settle()

    def give_credit(self, link: Link, n: int) -> None:
        if n > 0 and link.state & Endpoint.LOCAL_ACTIVE and not self.closed:
            link.flow(n)

    def send(self, link: Link, tag: str, payload: bytes) -> Delivery:
        """Send ``payload`` (an encoded message) on outgoing ``link`` as one unsettled delivery; raises
        ``PeerMessageTooLarge`` (nothing sent) when it is over the max-message-size the client gave the link."""
        limit = link.remote_max_message_size
        if limit and len(payload) > limit:
            raise PeerMessageTooLarge(
                f"a message of {len(payload):,} bytes, over the client's max-message-size of {limit:,}"
            )
        delivery = link.delivery(tag)
        link.send(payload)
        link.advance()
        return delivery

    def close(self, condition: str | None = None, description: str = "") -> None:
        """Close the connection (with an error ``condition``, if given); the close frame goes out next."""
        connection = self.connection
        if connection is not None and connection.state & Endpoint.LOCAL_ACTIVE:
            if condition is not None:
                connection.condition = _condition(condition, description)
            connection.close()
        self.closed = True

    # --- output ----------------------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        out = self._out
        transport = self.transport
        if transport is not None:
            while True:
                pending = transport.pending()
                if pending <= 0:
                    break
                chunk = transport.peek(pending)
                if not chunk:
                    break
                out += pad(bytes(chunk))
                transport.pop(len(chunk))
        if not out:
            return b""
        data = bytes(out)
        out.clear()
        return data

    @property
    def finished(self) -> bool:
        """Closed and everything to say has been said."""
        if not self.closed:
            return False
        return self.transport is None or self.transport.pending() <= 0

    def discard(self) -> None:
        """Let go of proton's objects (the connection has ended)."""
        if self.connection is not None and self._collector is not None:
            self._collector.release()
        self._receivers.clear()
        self.transport = self.connection = self._collector = None
