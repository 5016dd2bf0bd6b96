"""The socket side of one AMQP connection: an ``asyncio.Protocol`` that moves bytes between the socket and
``AmqpConnection`` (through the session side, ``Session``), and keeps the connection's timers and pauses.

Invariants (as the MQTT head's ``client_socket``):
* Admission at accept, the TLS start and the end of a connection are ``SocketSide``'s
  (``protocol_heads.socket_side``, shared with the MQTT head); the handshake, SASL and the login (a ``$cbs`` token
  after SASL ANONYMOUS) share one timeout (``connect_timeout_s``).
* Bytes decrypted before ``start_tls`` has returned the TLS transport wait for it (``_held``): answers written
  before would go out in the clear on the raw socket.
* An incoming link takes messages of at most the bound current when it was attached (``HeadSettings.read_bound``:
  the deployment's largest ``maxMessageSizeBytes`` and framing), announced in its ``max-message-size``, for its
  whole life; a transfer past it is dropped as it comes and its link closed (``AmqpConnection``), never read whole.
* Reading pauses while the session has ``max_groups_in_flight`` groups waiting on the hub, and while the socket's
  write buffer is over its high-water mark; once the connection has ended, reading stays paused.
* The idle timer (proton's ``tick``) runs on one timer handle per connection, moved on when it fires, whether or
  not reading is paused: a client silent for ``idle_timeout_s`` (or that leaves our writes unread that long) gets
  the idle close and one refusal line, and its socket is gone within ``close_grace_s`` of the close
  (``SocketSide.goodbye``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl

from edgehub.core.refusals import RefusalReason
from protocol_heads.amqp.connection import AmqpConnection
from protocol_heads.amqp.session import Session
from protocol_heads.amqp.settings import AmqpSettings
from protocol_heads.listeners import HeadServer
from protocol_heads.socket_side import SocketSide

__all__ = ["ClientSocket"]

log = logging.getLogger(__name__)


class ClientSocket(SocketSide[HeadServer[AmqpSettings, Session], AmqpSettings, AmqpConnection], asyncio.Protocol):
    """One connection's socket side (module docstring); ``session`` is its session side, ``conn`` the protocol."""

    def __init__(self, server: HeadServer[AmqpSettings, Session], tls: ssl.SSLContext | None) -> None:
        super().__init__(server, tls)
        s = server.settings
        mechanisms = ("EXTERNAL", "PLAIN", "ANONYMOUS") if tls is not None else ("PLAIN", "ANONYMOUS")
        self.conn = AmqpConnection(
            mechanisms=mechanisms,
            max_frame_size=s.max_frame_size,
            max_sessions=s.max_sessions,
            max_links=s.max_links,
            max_message_size=s.max_message_size,
            # Asked at each attach: a link takes the deployment's bound as it is then (HeadSettings.read_bound).
            link_message_size=functools.partial(s.read_bound, s.max_message_size),
            idle_timeout_s=s.idle_timeout_s,
            max_sessions_before_login=s.max_sessions_before_login,
            max_links_before_login=s.max_links_before_login,
            max_unfinished_bytes_before_login=s.max_unfinished_bytes_before_login,
        )
        self.session = Session(server, self, self.conn)
        self._tick: asyncio.TimerHandle | None = None
        self._held: list[bytes] | None = None  # reads while start_tls runs (data_received)

    # --- asyncio.Protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._admit(transport):
            self.server.start_client(self)

    def data_received(self, data: bytes) -> None:
        if self._early is not None:  # TLS bytes before the handshake began: kept for it
            self._keep_early(data)
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
        self._peer_eof = True
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
        self._set_reading(transport, pause)

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
        if self._reading_paused and not self._writing_paused:
            # Not reading is the hub's doing (groups waiting on it): the client is not silent. Looked at again
            # soon, not left for the next read, which a client that has gone quiet meanwhile never sends; soon, so
            # that proton's keepalives to the client resume within a second of reading.
            self._tick = self._loop.call_later(min(self.settings.idle_timeout_s / 2, 1.0), self._on_tick)
            return
        # A client that leaves our writes unread is not read either (its write buffer paused reading): its
        # silence is counted all the same, so it goes after its idle timeout too.
        self._arm_tick()
        self.flush()
        if self.conn.idle_expired:
            if self._writing_paused:
                self.refused(RefusalReason.NOT_READING, timeout_s=self.settings.idle_timeout_s)
            else:
                self.refused(RefusalReason.KEEPALIVE_TIMEOUT, timeout_s=self.settings.idle_timeout_s)
            self.finish()

    def _stop_timers(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    # --- the connection's task ------------------------------------------------------------------------------

    async def _log_in(self) -> bool:
        """SASL (and a ``$cbs`` token after ANONYMOUS) happen as reads arrive: wait for the session to say so, or
        for the end."""
        await asyncio.wait({self.session.logged_in, self._end}, return_when=asyncio.FIRST_COMPLETED)
        return True

    def _claimed(self) -> str | None:
        return self.session.claimed()

    def _login_timed_out(self) -> None:
        self.conn.close(UNAUTHORIZED_TIMEOUT, "no login in time")
        self.flush()

    def _tls_starting(self) -> None:
        self._held = []

    def _tls_started(self) -> None:
        held, self._held = self._held, None
        for data in held or ():
            self.data_received(data)

    async def cleanup(self) -> None:
        try:
            await self.session.close()
        finally:
            self.session.cancel()
            self.finish()
            self.flush()
            self.close()
            try:
                await self.goodbye()
            finally:
                self.dispose()

    def dispose(self) -> None:
        """Let go of everything that could lead back here, so reference counting alone frees the connection."""
        super().dispose()
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        self.transport = None
        self.session.dispose()
        self.conn.discard()


UNAUTHORIZED_TIMEOUT = "amqp:unauthorized-access"
