"""The socket side of one MQTT connection: an ``asyncio.BufferedProtocol`` that moves bytes between the socket and
``ServerConnection``, and keeps the connection's timers and pauses. What the client is to the hub (login, events,
ingest, twins, will) is the session side, ``Session`` in ``session.py``, which it feeds every read.

Once the client is authenticated, every read arrives in ``buffer_updated`` and goes to the session there, without
a task wake-up, a stream buffer or a timeout per read. Reads go into one buffer per server, allocated once and
handed to each of its connections (``read_buffer``); each read is copied out of it before anything else runs,
and the event loop calls ``get_buffer`` and ``buffer_updated`` back to back, so connections never see each
other's bytes. The connection's task
(``mqtt.client {peer}``, ``run``) only does the TLS handshake and the login, waits for the end and cleans up.

While deliveries to a client wait for its acks, its segments are ACKed at once (Linux: ``TCP_QUICKACK``, set again
after each of its reads, since the kernel drops it): most clients leave Nagle's algorithm on, so a client holds a
small PUBACK back until its previous segment is ACKed, and the kernel delays that ACK by up to 40 ms when the hub
has nothing to send back, which stalled delivery each time a window drained. A client that only publishes gets
its PUBACKs (and the ACK with them) once its group is stored, and acking its segments at once would only split
its PUBLISHes into smaller reads.

Invariants:
* Reading pauses while the session has ``max_groups_in_flight`` groups waiting on the hub, while the socket's write
  buffer is over its high-water mark (a client that does not read its acks is not read either), and before login
  once more than a read's worth waits; once the connection has ended, reading stays paused.
* Admission at accept, the TLS start and the end of a connection are ``SocketSide``'s
  (``protocol_heads.socket_side``, shared with the AMQP head); the handshake, CONNECT and login share one timeout.
* A connection takes packets of at most the bound current when it was accepted (``HeadSettings.read_bound``: the
  deployment's largest ``maxMessageSizeBytes`` and framing), announced to MQTT 5 clients, for its whole life; a
  larger packet is refused (DISCONNECT 0x95) from its fixed header, before its body is read.
* A client silent for 1.5x its keepalive is closed (MQTT 5: 0x8D). Silence is kept by one timer per connection,
  moved on only when it fires, and not counted while reading is paused by us; but a client that does not read
  (its write buffer stays over the high-water mark) for its keepalive timeout, or ``not_reading_timeout_s``
  without one, is aborted, its unread bytes dropped.
* A closed connection is freed by reference counting alone (``dispose`` breaks every cycle through it and its
  session): ``edgehub run`` runs the cycle collector rarely, and cycles of closed connections held their buffers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import ssl
from collections import deque
from collections.abc import Callable

from edgehub.core.refusals import RefusalReason
from edgehub.mqtt.packets import ReasonCode
from protocol_heads.listeners import HeadServer
from protocol_heads.mqtt.connection import ServerConnection
from protocol_heads.mqtt.session import Session
from protocol_heads.mqtt.settings import MqttSettings
from protocol_heads.socket_side import SocketSide

__all__ = ["READ_SIZE", "ClientSocket"]

log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024  # the server's one read buffer; also what may wait unread before login
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only; see the module docstring


class ClientSocket(
    SocketSide[HeadServer[MqttSettings, Session], MqttSettings, ServerConnection], asyncio.BufferedProtocol
):
    """One connection's socket side (module docstring); ``session`` is its session side, ``conn`` the protocol.
    ``read_buffer`` is the server's one buffer (``READ_SIZE`` bytes) that every connection reads into."""

    def __init__(
        self, server: HeadServer[MqttSettings, Session], tls: ssl.SSLContext | None, read_buffer: memoryview
    ) -> None:
        super().__init__(server, tls)
        self._read_buffer = read_buffer
        s = server.settings
        self.conn = ServerConnection(
            # The deployment's bound as it is now, kept for the connection's life: CONNACK announces it.
            max_packet_size=s.read_bound(s.max_packet_size),
            receive_maximum=s.receive_maximum,
            outbound_window=s.outbound_window,
            topic_cache_bytes=s.topic_cache_bytes,
        )
        self.session = Session(server, self, self.conn)
        # Reads before the client is live (CONNECT, and what follows it while the hub authenticates).
        self._inbox: deque[bytes] = deque()
        self._inbox_bytes = 0
        self._data_waiter: asyncio.Future[None] | None = None
        self._live = False  # authenticated: reads go straight to the session
        self._keepalive: asyncio.TimerHandle | None = None
        self._not_reading: asyncio.TimerHandle | None = None  # armed while writing is paused (module docstring)
        self._last_read = 0.0
        self._quickack: Callable[[], None] | None = None  # re-arms TCP_QUICKACK (see the module docstring)
        self._quickack_sock: socket.socket | None = None

    # --- asyncio.BufferedProtocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._admit(transport):
            return
        sock = transport.get_extra_info("socket")
        if _QUICKACK is not None and sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # A socket object of our own, on a duplicate of the descriptor (closed in connection_lost): uvloop's
            # transport socket builds and detaches a socket object for every setsockopt.
            own = socket.socket(sock.family, sock.type, sock.proto, fileno=os.dup(sock.fileno()))
            self._quickack_sock = own
            self._quickack = functools.partial(own.setsockopt, socket.IPPROTO_TCP, _QUICKACK, 1)
        self.server.start_client(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(self._read_buffer[:nbytes])
        if self._early is not None:  # TLS bytes before the handshake began: kept for it
            self._keep_early(data)
            return
        if self._ended:  # the connection has ended: what still comes is dropped (a lingering close)
            return
        if self._live:
            if self._quickack is not None and self.session.awaiting_acks:  # see the module docstring
                try:
                    self._quickack()
                except OSError:
                    pass  # the peer is gone: the read's handling finds out
            self._last_read = self._loop.time()
            try:
                self.session.on_data(data)
            except Exception:
                # A bug in handling this client's bytes ends this client only.
                log.exception("mqtt.client_crashed peer=%s", self.peer)
                self.finish()
            return
        self._inbox.append(data)
        self._inbox_bytes += len(data)
        if self._inbox_bytes > READ_SIZE:  # the login has not taken it yet: do not buffer without bound
            self._update_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._peer_eof = True
        self.finish()
        # Keep the write side open until cleanup: acks of groups still being stored may go out (TLS cannot). Once
        # our side is shut (close), the client's EOF is the end: the socket closes now.
        return not self._shut and self.transport is not None and self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._not_reading is not None:
            self._not_reading.cancel()
            self._not_reading = None
        self._close_quickack()
        self.finish()
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True
        if self._not_reading is None and not self._ended:
            limit = self.conn.keepalive_timeout_s or self.settings.not_reading_timeout_s
            self._not_reading = self._loop.call_later(limit, self._stopped_reading, limit)
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._not_reading is not None:
            self._not_reading.cancel()
            self._not_reading = None
        self._update_reading()

    def _stopped_reading(self, limit: float) -> None:
        """The client has left our writes unread for ``limit`` seconds: abort, dropping what it did not read."""
        self._not_reading = None
        if self._ended or not self._writing_paused:
            return
        self.refused(RefusalReason.NOT_READING, waited_s=limit)
        self.conn.close(ReasonCode.KEEP_ALIVE_TIMEOUT)
        if self.transport is not None:
            self.transport.abort()
        self.finish()

    # --- reading -------------------------------------------------------------------------------------------

    def _update_reading(self) -> None:
        """Read unless a limit says not to: the login's buffer, the groups in flight, the write buffer."""
        transport = self.transport
        if self._ended or transport is None or transport.is_closing():
            return  # once ended, reading stays paused (finish) whatever frees up later
        pause = (
            self._writing_paused
            or self._groups_in_flight >= self.settings.max_groups_in_flight
            or (not self._live and self._inbox_bytes > READ_SIZE)
        )
        self._set_reading(transport, pause)

    def _wake_reader(self) -> None:
        waiter = self._data_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self) -> bytes:
        """The next read before the client is live; b"" once the connection has ended."""
        while not self._inbox:
            if self._ended:
                return b""
            self._data_waiter = self._loop.create_future()
            try:
                await self._data_waiter
            finally:
                self._data_waiter = None
        data = self._inbox.popleft()
        self._inbox_bytes -= len(data)
        self._update_reading()
        return data

    def _stop_timers(self) -> None:
        self._live = False
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self._wake_reader()

    def _check_keepalive(self) -> None:
        timeout = self.conn.keepalive_timeout_s
        self._keepalive = None
        if self._ended or timeout is None:
            return
        now = self._loop.time()
        if self._reading_paused:  # not reading is our doing, not the client's silence
            self._last_read = now
        due = self._last_read + timeout
        if now >= due:
            self.refused(RefusalReason.KEEPALIVE_TIMEOUT, timeout_s=timeout)
            self.conn.close(ReasonCode.KEEP_ALIVE_TIMEOUT)
            self.finish()
            return
        self._keepalive = self._loop.call_at(due, self._check_keepalive)

    # --- the connection's task -----------------------------------------------------------------------------

    def _claimed(self) -> str | None:
        return self.session.claimed()

    async def _log_in(self) -> bool:
        """CONNECT and the login (``SocketSide.run``); then, synchronously, what the client pipelined and what came
        while the hub authenticated, and the client is live."""
        session = self.session
        pipelined = await session.open()
        if pipelined is None:
            return False
        session.dispatch(pipelined)
        # What came while the hub authenticated (even if the client has hung up since), then live: from here
        # on buffer_updated hands every read to the session.
        while self._inbox and not self.conn.closed:
            data = self._inbox.popleft()
            self._inbox_bytes -= len(data)
            session.dispatch(self.conn.receive_data(data))
        self._inbox.clear()
        self._inbox_bytes = 0
        if self.conn.closed:
            self.finish()
        self._live = not self._ended
        self._update_reading()
        keepalive_s = self.conn.keepalive_timeout_s
        if self._live and keepalive_s is not None:
            self._last_read = self._loop.time()
            self._keepalive = self._loop.call_at(self._last_read + keepalive_s, self._check_keepalive)
        return True

    async def cleanup(self) -> None:
        try:
            await self.session.close()
        finally:
            # Also when cancelled (server shutdown): the socket never outlives its client task.
            self.session.cancel()
            if self.server.stopping and self.client_id is not None:
                # After the acks of what it sent (session.close let those writes finish): an MQTT 5 client
                # learns the server is going away (DISCONNECT 0x8B), not just that the socket closed.
                self.conn.close(ReasonCode.SERVER_SHUTTING_DOWN, reason="server shutting down")
            self.finish()
            self.close()
            # The buffers go now, not when the socket is gone (a TLS goodbye may take close_grace_s).
            self._inbox.clear()
            self._inbox_bytes = 0
            self.conn.discard_input()
            try:
                await self.goodbye()
            finally:
                self.dispose()

    def dispose(self) -> None:
        """Let go of everything that could lead back here, so that reference counting alone frees this connection
        and its buffers once the loop lets go of it: ``edgehub run`` runs the cycle collector rarely (tune_gc),
        and cycles of closed connections held their buffers until it did. Last thing a connection does."""
        super().dispose()
        for handle in (self._keepalive, self._not_reading):
            if handle is not None:
                handle.cancel()
        self._keepalive = self._not_reading = None
        self._close_quickack()
        self._inbox.clear()
        self._inbox_bytes = 0
        self._data_waiter = None
        self.transport = None
        self.session.dispose()

    def _close_quickack(self) -> None:
        self._quickack = None
        if self._quickack_sock is not None:
            self._quickack_sock.close()  # the last descriptor of the socket: the kernel closes the connection now
            self._quickack_sock = None
