"""What both protocol heads' socket sides share (``SocketSide``): admission at accept, the TLS start in the
connection's task with the bytes the socket read before it, the connection's end, pacing by ingest groups in
flight, flushing, and refusal lines. The MQTT head's ``ClientSocket`` (a buffered protocol) and the AMQP head's
(a plain one) subclass it with their reads, timers and cleanup.

Invariants:
* Connections are counted from accept (the server's ``ConnectionLimiter``): over a cap the socket is aborted in
  ``connection_made``, before any handshake or buffer, so a flood costs a descriptor for an instant.
* The TLS handshake runs in the connection's task (``loop.start_tls``: with ``create_server(ssl=...)`` the
  protocol hears of a connection only after its handshake, so handshakes piled up uncounted), and shares the
  login's timeout. Reading is paused from accept until then; what the socket read anyway (uvloop starts reading
  after ``connection_made`` even when reading is paused: the ClientHello) is handed to the TLS layer first.
* Once the connection has ended (``finish``), no read is taken and reading stays paused until the socket is being
  closed (``close``). Then, on plain TCP, the hub shuts its side and reads on, dropping what comes, until the client
  hangs up: closed with bytes unread, the socket would answer them with a reset, and a client still writing (the
  rest of a packet or transfer the hub refused) would fail on it before it read the hub's last words and their
  reason. TLS (no half-close) reads on for its own close_notify. Either way a closed connection lets go of its
  socket and its place under the caps within ``close_grace_s`` of ``close`` (``goodbye``).
* Every refusal line goes through the server's ``RefusalLog``, keyed by source address, naming the client.

A head's session side sees its socket side only through ``SessionSocket`` (what a session may ask of it), so the
session modules never import the socket modules that build them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any, Generic, Protocol, TypeVar, cast

from edgehub.core.refusals import RefusalReason
from edgehub.hub import Cap, Ticket
from protocol_heads.limits import HeadSettings
from protocol_heads.listeners import HeadServer
from protocol_heads.tls import peer_certificate

__all__ = ["Outgoing", "SessionSocket", "SocketSide"]


class Outgoing(Protocol):
    """The sans-IO connection as the socket side flushes it."""

    def data_to_send(self) -> bytes: ...


class SessionSocket(Protocol):
    """What a session side (and the links it hands the hub) may ask of its connection's socket side: each head's
    ``SocketSide`` is one. A head whose session needs more (the MQTT head's reads before login) extends it."""

    @property
    def peer(self) -> str:
        """address:port, for task names and delivery errors."""
        ...

    @property
    def address(self) -> str:
        """The source address: the key of the pre-login caps and the login throttle."""
        ...

    @property
    def client_id(self) -> str | None:
        """The authenticated identity, once ``authenticated`` was called."""
        ...

    def authenticated(self, client_id: str) -> None: ...

    def refused(self, reason: RefusalReason | str, *, client: str | None = None, **detail: object) -> None: ...

    def peer_certificate(self) -> tuple[str | None, str | None, bool]: ...

    def group_started(self) -> None: ...

    def group_done(self) -> None: ...

    def flush(self) -> None: ...

    def schedule_flush(self) -> None: ...

    def finish(self) -> None: ...

    def close(self) -> None: ...


def _feed(transport: asyncio.BaseTransport, data: bytes) -> None:
    """Hand ``data`` to the TLS protocol now on ``transport``, as if just read: asyncio's and uvloop's are both
    buffered protocols (uvloop's without subclassing asyncio's)."""
    protocol = cast(asyncio.BufferedProtocol, transport.get_protocol())
    view = memoryview(data)
    while view:
        buf = memoryview(protocol.get_buffer(len(view)))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        protocol.buffer_updated(n)
        view = view[n:]


ServerT = TypeVar("ServerT", bound="HeadServer[Any, Any]")
SettingsT = TypeVar("SettingsT", bound=HeadSettings)
ConnT = TypeVar("ConnT", bound=Outgoing)


class SocketSide(Generic[ServerT, SettingsT, ConnT]):
    """One connection's socket side, the part both heads share (module docstring), typed by the head's server,
    settings and sans-IO connection. A subclass sets ``conn`` and implements ``_update_reading``, ``_stop_timers``,
    ``_log_in`` and ``_claimed``; it is also the asyncio protocol (``asyncio.Protocol`` or
    ``asyncio.BufferedProtocol``) that ``start_tls`` takes over."""

    conn: ConnT

    def __init__(self, server: ServerT, tls: ssl.SSLContext | None) -> None:
        self.server = server
        self.settings: SettingsT = server.settings
        self.transport: asyncio.Transport | None = None
        self._tls = tls  # the handshake still to run in the connection's task, or None (plain TCP)
        # What the socket said before start_tls took it over: the ClientHello, handed to the TLS layer first.
        # None: TLS is on or not used.
        self._early: bytearray | None = bytearray() if tls is not None else None
        self.peer = "?"  # address:port, for task names
        self.address = "?"  # the source address: the key of the pre-login caps, the throttle and refusal lines
        self._port: object = "?"
        self.client_id: str | None = None  # the authenticated identity, for refusal lines
        self.ticket: Ticket | None = None  # this connection's place under the ConnectionLimiter's caps
        self._loop = asyncio.get_running_loop()
        self._flush_scheduled = False
        self._ended = False  # no more reads are taken (closed, EOF, lost, timeout, crash)
        self._end: asyncio.Future[None] = self._loop.create_future()  # set when _ended is
        self._lost: asyncio.Future[None] = self._loop.create_future()  # set by connection_lost
        self._groups_in_flight = 0
        self._writing_paused = False
        self._reading_paused = False
        self._peer_eof = False  # the client has hung up its side (a subclass's eof_received sets it)
        self._shut = False  # our side is shut (close on plain TCP): the client's EOF ends the socket

    # --- what a subclass adds -------------------------------------------------------------------------------

    def _update_reading(self) -> None:
        """Read unless one of the head's limits says not to."""
        raise NotImplementedError

    def _stop_timers(self) -> None:
        """The connection ended (``finish``): the head's timers stop and whatever waits for a read wakes."""
        raise NotImplementedError

    async def _log_in(self) -> bool:
        """The login after the TLS handshake, under the same timeout; True: the client is live (``run`` waits for
        the end), False: refused or gone (``run`` returns)."""
        raise NotImplementedError

    def _claimed(self) -> str | None:
        """Who the client said it was, for the line of a login that ran out of time."""
        raise NotImplementedError

    def _login_timed_out(self) -> None:
        """What the head tells a client whose login ran out of time, before its socket is aborted."""

    def _tls_starting(self) -> None:
        """Just before ``start_tls``."""

    def _tls_started(self) -> None:
        """Just after ``start_tls`` handed over the TLS transport."""

    # --- accept ---------------------------------------------------------------------------------------------

    def _admit(self, transport: asyncio.BaseTransport) -> bool:
        """``connection_made``'s common part: note the peer and take a ticket under the caps. False: over a cap,
        the socket aborted and the connection disposed of (the caller returns at once)."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple) and len(peername) >= 2:
            self.address = str(peername[0])
            self._port = peername[1]
            self.peer = f"{peername[0]}:{peername[1]}"
        admitted = self.server.limiter.admit(self.address)
        if isinstance(admitted, Cap):
            # Closed at once, before any handshake or buffer: a flood costs a descriptor for an instant.
            self.refused(RefusalReason.TOO_MANY_CONNECTIONS, cap=admitted.value)
            self._ended = True
            self.transport.abort()
            self.dispose()
            return False
        self.ticket = admitted
        if self._tls is not None:
            self.transport.pause_reading()  # the ClientHello waits for start_tls (run)
        return True

    def _keep_early(self, data: bytes) -> None:
        """Keep ``data``, read before the handshake began (``_early`` is not None), for the TLS layer."""
        assert self._early is not None
        self._early += data
        if self.transport is not None:
            self.transport.pause_reading()

    # --- the connection's task ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """The TLS handshake and the login under one timeout (``busy_connect_timeout_s`` while the pre-login slots
        are over half used), then the connection's life until ``finish``."""
        s = self.settings
        timeout_s = s.busy_connect_timeout_s if self.server.limiter.busy else s.connect_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                if self._tls is not None and not await self._start_tls(self._tls, timeout_s):
                    return
                if not await self._log_in():
                    return
        except TimeoutError:
            self.refused(RefusalReason.CONNECT_TIMEOUT, client=self._claimed(), timeout_s=timeout_s)
            self._login_timed_out()
            if self.transport is not None:
                self.transport.abort()  # no goodbye to wait for
            return
        await self._end
        self.flush()

    # --- TLS ------------------------------------------------------------------------------------------------

    async def _start_tls(self, context: ssl.SSLContext, timeout_s: float) -> bool:
        """The TLS handshake on the accepted socket; False (socket closed) when it fails."""
        raw = self.transport
        assert raw is not None
        if self._ended or raw.is_closing():  # gone before its handshake began
            return False
        early, self._early = self._early, None
        self._tls_starting()
        if early:
            # Runs after start_tls has put its TLS protocol on the socket, before that protocol's connection_made
            # (both scheduled by start_tls, after this): the bytes wait in its input buffer for the handshake.
            self._loop.call_soon(_feed, raw, bytes(early))
        try:
            tls = await self._loop.start_tls(
                raw,
                cast(asyncio.BaseProtocol, self),
                context,
                server_side=True,
                ssl_handshake_timeout=timeout_s,
                ssl_shutdown_timeout=self.settings.close_grace_s,  # not asyncio's 30 s, buffers held all along
            )
        except BaseException as exc:
            # The protocol hears nothing of a handshake that failed (no connection_lost): end here.
            raw.abort()
            self.finish()
            if not self._lost.done():
                self._lost.set_result(None)
            if isinstance(exc, OSError):  # ssl.SSLError, a reset, the handshake timeout (ConnectionAbortedError)
                self.refused(RefusalReason.TLS_HANDSHAKE_FAILED, error=type(exc).__name__)
                return False
            raise
        if tls is None:  # closed meanwhile
            raw.abort()
            return False
        self.transport = tls
        self._tls_started()
        return True

    def peer_certificate(self) -> tuple[str | None, str | None, bool]:
        """The client certificate's SHA-256 thumbprint and common name, and whether it was verified."""
        if self.transport is None:
            return None, None, False
        return peer_certificate(self.transport.get_extra_info("ssl_object"))

    # --- pacing and the end ---------------------------------------------------------------------------------

    def _set_reading(self, transport: asyncio.Transport, pause: bool) -> None:
        """Pause or resume reading as the head's limits say (``_update_reading``), if that is a change."""
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def group_started(self) -> None:
        """The session handed a group to the hub: at ``max_groups_in_flight`` reading pauses."""
        self._groups_in_flight += 1
        if self._groups_in_flight >= self.settings.max_groups_in_flight:
            self._update_reading()

    def group_done(self) -> None:
        self._groups_in_flight -= 1
        if self._reading_paused:
            self._update_reading()

    def finish(self) -> None:
        """Take no more reads; the connection's task goes on to clean up (and close the socket)."""
        if self._ended:
            return
        self._ended = True
        self._stop_timers()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            with contextlib.suppress(RuntimeError, NotImplementedError):  # TLS after close_notify, for one
                transport.pause_reading()
        self.flush()
        if not self._end.done():
            self._end.set_result(None)

    # --- writing --------------------------------------------------------------------------------------------

    def flush(self) -> None:
        data = self.conn.data_to_send()
        transport = self.transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)

    def schedule_flush(self) -> None:
        """Flush once, at the end of this turn of the event loop (whatever else is sent in it goes along)."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def close(self) -> None:
        """Close the socket once what was written has gone (later calls do nothing): plain TCP shuts our side
        and drains until the client hangs up, TLS says goodbye (close_notify) first (module docstring);
        ``goodbye`` bounds both."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._tls is None and not self._peer_eof and transport.can_write_eof():
            try:
                transport.write_eof()
                self._shut = True
                transport.resume_reading()  # what comes is dropped: the connection has ended
                self._reading_paused = False
                return
            except (OSError, RuntimeError):
                pass  # the socket is going anyway: closed below
        transport.close()
        if self._tls is not None:
            # asyncio's TLS layer, told of the peer's EOF while its reader was paused (finish pauses it), waits for
            # reading to resume before it shuts down, ignores close() meanwhile and arms no shutdown timeout: a
            # client that hung up as soon as it had its answer (a refused login) held its socket and its pre-login
            # slot until the server stopped. Reading again lets the layer finish; what it still decrypts is dropped
            # (the connection has ended). uvloop's layer shuts down on EOF at once; resuming does nothing there.
            with contextlib.suppress(RuntimeError, NotImplementedError):
                transport.resume_reading()

    async def goodbye(self) -> None:
        """After ``close``: wait for the socket to be gone, ``close_grace_s`` at most (a client that leaves our
        writes unread, or writes on and never hangs up, would hold it for ever), then abort it. Also when cancelled
        (the server stops), or the socket would outlive the loop, unclosed."""
        try:
            # Waited on, not awaited under a timeout: the timeout would cancel _lost, which then reads as done.
            await asyncio.wait((self._lost,), timeout=self.settings.close_grace_s)
        finally:
            if not self._lost.done() and self.transport is not None:
                self.transport.abort()

    # --- what the session asks of the socket ----------------------------------------------------------------

    def authenticated(self, client_id: str) -> None:
        """The client logged in as ``client_id``: no longer counted against the pre-login caps."""
        self.client_id = client_id
        if self.ticket is not None:
            self.ticket.authenticated()

    def refused(self, reason: RefusalReason | str, *, client: str | None = None, **detail: object) -> None:
        """One refusal line through the server's RefusalLog: keyed by source address, naming the client."""
        if client is None:
            client = self.client_id
        self.server.refusals.refused(reason, peer=self.address, client=client, port=self._port, **detail)

    def dispose(self) -> None:
        """Give back this connection's place under the caps (a subclass lets go of the rest, then calls this)."""
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None
