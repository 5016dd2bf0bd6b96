"""The socket side of one AMQP connection: an ``asyncio.Protocol`` that moves bytes between the socket and
``AmqpConnection`` (through the session side, ``Session``), and keeps the connection's timers and pauses.

Invariants (as the MQTT head's ``client_socket``):
* Connections are counted from accept (``ConnectionLimiter``); over a cap the socket is closed at once.
* The TLS handshake runs in the connection's task (``loop.start_tls``), and the handshake, SASL and the login (a
  ``$cbs`` token after SASL ANONYMOUS) share one timeout (``connect_timeout_s``).
* Reading pauses while the session has ``max_groups_in_flight`` groups waiting on the hub, and while the socket's
  write buffer is over its high-water mark; once the connection has ended, reading stays paused.
* The idle timer (proton's ``tick``) runs on one timer handle per connection, moved on when it fires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import TYPE_CHECKING, cast

from edgehub.core.refusals import RefusalReason
from edgehub.hub import Cap, Ticket
from protocol_heads.amqp.connection import AmqpConnection
from protocol_heads.amqp.session import Session
from protocol_heads.tls import peer_certificate

if TYPE_CHECKING:
    from protocol_heads.amqp.server import AmqpServer

__all__ = ["ClientSocket"]

log = logging.getLogger(__name__)

_TLS_SHUTDOWN_S = 5.0


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


class ClientSocket(asyncio.Protocol):
    """One connection's socket side (module docstring); ``session`` is its session side, ``conn`` the protocol."""

    def __init__(self, server: AmqpServer, tls: ssl.SSLContext | None) -> None:
        self.server = server
        self.settings = s = server.settings
        self.transport: asyncio.Transport | None = None
        self._tls = tls
        self._early: bytearray | None = bytearray() if tls is not None else None
        self.peer = "?"
        self.address = "?"
        self._port: object = "?"
        self.client_id: str | None = None
        self.ticket: Ticket | None = None
        mechanisms = ("EXTERNAL", "PLAIN", "ANONYMOUS") if tls is not None else ("PLAIN", "ANONYMOUS")
        self.conn = AmqpConnection(
            mechanisms=mechanisms,
            max_frame_size=s.max_frame_size,
            max_sessions=s.max_sessions,
            max_links=s.max_links,
            max_message_size=s.max_message_size,
            idle_timeout_s=s.idle_timeout_s,
        )
        self.session = Session(server, self, self.conn)
        self._loop = asyncio.get_running_loop()
        self._flush_scheduled = False
        self._ended = False
        self._end: asyncio.Future[None] = self._loop.create_future()
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._groups_in_flight = 0
        self._writing_paused = False
        self._reading_paused = False
        self._tick: asyncio.TimerHandle | None = None
        self._held: list[bytes] | None = None  # reads while start_tls runs (data_received)

    # --- asyncio.Protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple) and len(peername) >= 2:
            self.address = str(peername[0])
            self._port = peername[1]
            self.peer = f"{peername[0]}:{peername[1]}"
        admitted = self.server.limiter.admit(self.address)
        if isinstance(admitted, Cap):
            self.refused(RefusalReason.TOO_MANY_CONNECTIONS, cap=admitted.value)
            self._ended = True
            self.transport.abort()
            self.dispose()
            return
        self.ticket = admitted
        if self._tls is not None:
            self.transport.pause_reading()  # the ClientHello waits for start_tls (run)
        self.server._start(self)

    def data_received(self, data: bytes) -> None:
        if self._early is not None:  # TLS bytes before the handshake began: keep them for it
            self._early += data
            if self.transport is not None:
                self.transport.pause_reading()
            return
        if self._ended:
            return
        if self._held is not None:
            # Decrypted bytes can arrive before start_tls has returned the TLS transport: answers written now
            # would go out in the clear on the raw socket, so they wait for it (_start_tls).
            self._held.append(data)
            return
        try:
            self.session.on_data(data)
        except Exception:
            # A bug in handling this client's bytes ends this client only.
            log.exception("amqp.client_crashed peer=%s", self.peer)
            self.finish()
            return
        self._arm_tick()
        if self.conn.closed:
            self.finish()

    def eof_received(self) -> bool:
        self.finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish()
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    # --- reading and timers ---------------------------------------------------------------------------------

    def _update_reading(self) -> None:
        transport = self.transport
        if self._ended or transport is None or transport.is_closing() or self._early is not None:
            return
        pause = self._writing_paused or self._groups_in_flight >= self.settings.max_groups_in_flight
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def group_started(self) -> None:
        self._groups_in_flight += 1
        if self._groups_in_flight >= self.settings.max_groups_in_flight:
            self._update_reading()

    def group_done(self) -> None:
        self._groups_in_flight -= 1
        if self._reading_paused:
            self._update_reading()

    def _arm_tick(self) -> None:
        if self._tick is not None or self._ended:
            return
        deadline = self.conn.tick(self._loop.time())
        if deadline > 0:
            self._tick = self._loop.call_at(deadline, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        if self._ended:
            return
        if self._reading_paused:
            return  # not reading is our doing: the client is not silent (re-armed by the next read)
        self._arm_tick()
        self.flush()
        if self.conn.closed:
            self.refused(RefusalReason.KEEPALIVE_TIMEOUT, timeout_s=self.settings.idle_timeout_s)
            self.finish()

    def finish(self) -> None:
        """Take no more reads; the connection's task goes on to clean up (and close the socket)."""
        if self._ended:
            return
        self._ended = True
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        transport = self.transport
        if transport is not None and not transport.is_closing():
            with contextlib.suppress(RuntimeError, NotImplementedError):
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
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self.flush()

    # --- what the session asks of the socket ----------------------------------------------------------------

    def authenticated(self, client_id: str) -> None:
        self.client_id = client_id
        if self.ticket is not None:
            self.ticket.authenticated()

    def refused(self, reason: RefusalReason | str, *, client: str | None = None, **detail: object) -> None:
        if client is None:
            client = self.client_id
        self.server.refusals.refused(reason, peer=self.address, client=client, port=self._port, **detail)

    def peer_certificate(self) -> tuple[str | None, str | None, bool]:
        """The client certificate's SHA-256 thumbprint and common name, and whether it was verified."""
        if self.transport is None:
            return None, None, False
        return peer_certificate(self.transport.get_extra_info("ssl_object"))

    # --- the connection's task ------------------------------------------------------------------------------

    async def run(self) -> None:
        s = self.settings
        timeout_s = s.busy_connect_timeout_s if self.server.limiter.busy else s.connect_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                if self._tls is not None and not await self._start_tls(self._tls, timeout_s):
                    return
                await asyncio.wait({self.session.logged_in, self._end}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            self.refused(RefusalReason.CONNECT_TIMEOUT, client=self.session.claimed(), timeout_s=timeout_s)
            self.conn.close(UNAUTHORIZED_TIMEOUT, "no login in time")
            self.flush()
            if self.transport is not None:
                self.transport.abort()
            return
        await self._end
        self.flush()

    async def _start_tls(self, context: ssl.SSLContext, timeout_s: float) -> bool:
        raw = self.transport
        assert raw is not None
        if self._ended or raw.is_closing():
            return False
        early, self._early = self._early, None
        self._held = []
        if early:
            self._loop.call_soon(_feed, raw, bytes(early))
        try:
            tls = await self._loop.start_tls(
                raw,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=timeout_s,
                ssl_shutdown_timeout=_TLS_SHUTDOWN_S,
            )
        except BaseException as exc:
            raw.abort()
            self.finish()
            if not self._lost.done():
                self._lost.set_result(None)
            if isinstance(exc, OSError):
                self.refused(RefusalReason.TLS_HANDSHAKE_FAILED, error=type(exc).__name__)
                return False
            raise
        if tls is None:
            raw.abort()
            return False
        self.transport = tls
        held, self._held = self._held, None
        for data in held or ():
            self.data_received(data)
        return True

    async def cleanup(self) -> None:
        try:
            await self.session.close()
        finally:
            self.session.cancel()
            self.finish()
            self.flush()
            if self.transport is not None:
                self.transport.close()
            try:
                with contextlib.suppress(Exception):
                    await self._lost
            finally:
                if not self._lost.done() and self.transport is not None:
                    # Cancelled (the server stops) while a TLS goodbye was still pending: drop the socket now, or
                    # it outlives the loop, unclosed.
                    self.transport.abort()
                self.dispose()

    def dispose(self) -> None:
        """Let go of everything that could lead back here, so reference counting alone frees the connection."""
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        self.transport = None
        self.session.dispose()
        self.conn.discard()


UNAUTHORIZED_TIMEOUT = "amqp:unauthorized-access"
