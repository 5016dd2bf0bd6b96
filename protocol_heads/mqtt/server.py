"""The asyncio adapter of the MQTT head: listeners, one protocol object and one task per client, and the calls
into the hub facade.

It only moves bytes between sockets and ``ServerConnection``, runs the timers and asks the hub; the protocol
lives in ``connection.py`` and the IoT Hub conventions in ``iothub.py``.

Each connection is an ``asyncio.BufferedProtocol`` (``_Client``): once the client is authenticated, every socket
read arrives in ``buffer_updated``, is decoded there and handed on without a task wake-up, a stream buffer or a
timeout per read (bench.ingest's profile: that machinery cost more per message than decoding it). Reads go into
one buffer per server, allocated once (``recv`` of 256 KiB allocated and shrank a new bytes object per read,
~20 us each here); each read is copied out of it before anything else runs, and the event loop calls
``get_buffer`` and ``buffer_updated`` back to back, so connections never see each other's bytes. The
connection's task (``mqtt.client {peer}``) only authenticates, waits for the end and cleans up.

While deliveries to a client wait for its acks, its segments are ACKed at once (Linux: ``TCP_QUICKACK``, set again
after each of its reads, since the kernel drops it). Most clients (paho, so the Azure IoT SDKs; libmosquitto) leave
Nagle's algorithm on, so a client holds each small PUBACK back until its previous segment is ACKed, and the kernel
delays that ACK by up to 40 ms when the hub has nothing to send back: each time a module's delivery window drained
(the end of a batch), delivery stood still for 40 ms. bench.ingest's module-to-module p50 went from ~190 ms to ~25
ms, and draining a stored queue to a libmosquitto client from ~4,300 to ~18,000 msg/s. It costs one ``setsockopt``
per read, and is set only while deliveries to the client are unacknowledged: a client that only publishes gets its
PUBACKs (and the ACK with them) once its group is stored anyway, and acking its segments at once would only split
its PUBLISHes into more, smaller reads and groups, each with its own group work (module-to-module runs, three each:
158 -> 151 us of hub CPU per message, within this machine's noise).

Invariants:
* Every client task runs in the server's ``TaskGroup`` under a name; it and the protocol callbacks catch
  everything but cancellation, so one bad client never cancels the server or another client.
* All PUBLISHes of one socket read go to ``Hub.ingest`` as one group (one task per group); reading goes on while
  earlier groups are being stored, and pauses while ``max_groups_in_flight`` of them wait on the hub or while
  the socket's write buffer is over its high-water mark (a client that does not read its acks is not read
  either); acks still leave in arrival order because ``ServerConnection.settle`` orders them.
* A hostile outside costs bounded memory and descriptors (each bound is an ``MqttSettings`` field):
  connections are counted from accept (``ConnectionLimiter``: pre-login caps in total and per address, a total
  cap under the descriptor limit, see ``connection_cap``); the TLS handshake runs in the connection's task
  (``loop.start_tls``: with ``create_server(ssl=...)`` the protocol hears of a connection only after its
  handshake, so handshakes piled up uncounted), and the handshake, CONNECT and authentication share one timeout
  (``connect_timeout_s``; ``busy_connect_timeout_s`` while over half the pre-login cap is in use); failed
  logins are throttled per address and claimed client id (``LoginThrottle``).
* A client silent for 1.5x its keepalive is closed (MQTT 5: 0x8D). Silence is kept by one timer per
  connection, moved on only when it fires, and not counted while reading is paused by the hub or by
  back-pressure; but a client that does not read (its write buffer stays over the high-water mark) for its
  keepalive timeout, or ``not_reading_timeout_s`` without one, is aborted, its unread bytes dropped.
* Every refusal (login, ACL, limits, protocol errors, timeouts, dropped messages) is logged through the
  server's one ``RefusalLog`` (``MqttServer.refusals``), per source address, with the client id once known.
* A closed connection is freed by reference counting alone (``_Client._dispose`` breaks every cycle through
  it): ``edgehub run`` runs the cycle collector rarely, and cycles of closed connections held their buffers.
* One live connection per identity: a new one takes the session over and the old one is closed (MQTT 5:
  0x8E); the hub is told with ``Hub.connect`` and the old link's deliveries come again on the new link.
* A refused message gets MQTT 5's reason (``REJECT_REASONS``) and the hub's detail as Reason String; a 3.1.1
  client is disconnected instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import socket
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self, cast

import msgspec

from edgehub.core import (
    AuthenticationError,
    DeliveryError,
    EdgeHubError,
    FailureKind,
    Identity,
    InvalidMessageError,
    LocalProtocolError,
    Message,
    StorageIOError,
    StoreError,
    SystemProperty,
    TwinError,
)
from edgehub.core.refusals import RefusalLog, RefusalReason
from edgehub.hub import Cap, ConnectionLimiter, Credentials, Delivery, Hub, LoginThrottle, Rejected, Ticket
from protocol_heads.mqtt.caches import BudgetDict
from protocol_heads.mqtt.codec import (
    MQTT_50,
    NO_PROPERTIES,
    Connect,
    Properties,
    PropertyId,
    Publish,
    ReasonCode,
)
from protocol_heads.mqtt.connection import (
    ConnectionState,
    ConnectRequested,
    DeliveryAcked,
    Disconnected,
    Event,
    MessageReceived,
    PeerPacketTooLarge,
    ProtocolFailed,
    ServerConnection,
    SubscribeRequested,
    UnsubscribeRequested,
)
from protocol_heads.mqtt.iothub import (
    TopicError,
    TwinRequest,
    delivery_user_properties,
    device_bound_topic,
    is_method_response,
    message_from_publish,
    module_input_topic,
    parse_client_id,
    parse_twin_request,
    topic_matches,
    twin_response_topic,
    username_identity,
)
from protocol_heads.mqtt.settings import MqttSettings, connection_cap

__all__ = ["REJECT_REASONS", "MqttServer", "MqttSettings", "connection_cap"]

log = logging.getLogger(__name__)

# Hub rejection reasons → MQTT 5 reason codes of the negative PUBACK/PUBREC.
REJECT_REASONS: Mapping[str, int] = {
    "quota_exceeded": ReasonCode.QUOTA_EXCEEDED,
    "too_large": ReasonCode.PACKET_TOO_LARGE,
    "not_authorized": ReasonCode.NOT_AUTHORIZED,
    "topic_invalid": ReasonCode.TOPIC_NAME_INVALID,
    "invalid": ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
    # sessionId and partitionKey differ: the PUBLISH is well formed but the hub will not take it, which is 0x83's
    # meaning in MQTT 5 (0x99 "payload format invalid" is about the payload format indicator, not properties).
    "partition_key_mismatch": ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
    # The disk refused the write (full, failing): 0x97 tells the device to hold on to it and retry later.
    "store_unavailable": ReasonCode.QUOTA_EXCEEDED,
}
_STORE_UNAVAILABLE = Rejected("store_unavailable", "the hub cannot store messages now (disk full or failing)")

_READ_SIZE = 256 * 1024
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only; see the module docstring
_LOGIN_REFUSALS: Mapping[int, RefusalReason] = {
    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID: RefusalReason.BAD_CLIENT_ID,
    ReasonCode.BAD_USERNAME_OR_PASSWORD: RefusalReason.BAD_USERNAME,
}
# How long a closing TLS connection waits for the peer's close_notify (asyncio's default: 30 s, the connection's
# buffers held all along).
_TLS_SHUTDOWN_S = 5.0
_ENTRY_OVERHEAD = 512  # a telemetry cache entry's two property maps and tuple, beside its topic's text


def _feed(transport: asyncio.BaseTransport, data: bytes) -> None:
    """Hand ``data`` to the (buffered) protocol now on ``transport``, as if the socket had just read it."""
    protocol = cast(asyncio.BufferedProtocol, transport.get_protocol())
    view = memoryview(data)
    while view:
        buf = memoryview(protocol.get_buffer(len(view)))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        protocol.buffer_updated(n)
        view = view[n:]


def _shown(text: str, limit: int = 128) -> str:
    """A client's words (client id, topic) fit for a log line: bounded, and quoted unless plain."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return text if text.isprintable() and " " not in text else repr(text)


class MqttServer:
    """``async with MqttServer(hub, settings=...) as server:`` listens until the block ends.
    ``server.ports`` maps ``"tcp"``/``"tls"`` to the bound port numbers."""

    def __init__(self, hub: Hub, *, settings: MqttSettings) -> None:
        if settings.tls_port is not None and settings.ssl_context is None:
            raise ValueError("a TLS listener needs an ssl_context")
        self.hub = hub
        self.settings = settings
        self.ports: dict[str, int] = {}
        self._tg = asyncio.TaskGroup()
        self._servers: list[asyncio.Server] = []
        self._read_buffer = memoryview(bytearray(_READ_SIZE))  # every connection reads into it (see above)
        self._clients: dict[str, _Client] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.refusals = RefusalLog(log, clock=settings.clock)
        self.limiter = ConnectionLimiter(
            max_connections=connection_cap(settings),
            max_pending=settings.max_pending_connections,
            max_pending_per_address=settings.max_pending_per_address,
        )
        # Failed logins, per claimed client id and per source address (MqttSettings says why two).
        self.throttle = LoginThrottle(
            max_failures=settings.max_login_failures, window_s=settings.login_failure_window_s, clock=settings.clock
        )
        self.address_throttle = LoginThrottle(
            max_failures=settings.max_login_failures_per_address,
            window_s=settings.login_failure_window_s,
            clock=settings.clock,
        )

    async def __aenter__(self) -> Self:
        await self._tg.__aenter__()
        s = self.settings
        try:
            loop = asyncio.get_running_loop()
            if s.tcp_port is not None:
                srv = await loop.create_server(functools.partial(_Client, self, None), s.host, s.tcp_port)
                self._servers.append(srv)
                self.ports["tcp"] = srv.sockets[0].getsockname()[1]
            if s.tls_port is not None:
                # Plain TCP: the handshake runs in the client's task (start_tls), counted and timed from accept.
                srv = await loop.create_server(functools.partial(_Client, self, s.ssl_context), s.host, s.tls_port)
                self._servers.append(srv)
                self.ports["tls"] = srv.sockets[0].getsockname()[1]
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        log.info(
            "mqtt.listening host=%s ports=%s max_connections=%d max_pending=%d",
            s.host,
            self.ports,
            self.limiter.max_connections,
            self.limiter.max_pending,
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for srv in self._servers:
            srv.close()
        for task in list(self._tasks):
            task.cancel()
        await self._tg.__aexit__(exc_type, exc, tb)
        for srv in self._servers:
            await srv.wait_closed()

    @property
    def connected(self) -> list[str]:
        """Identity ids with a live, authenticated connection."""
        return sorted(self._clients)

    def _start(self, client: _Client) -> None:
        task = self._tg.create_task(self._run_client(client), name=f"mqtt.client {client.peer}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_client(self, client: _Client) -> None:
        try:
            await client.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            # One bad client never takes the server down.
            log.exception("mqtt.client_crashed peer=%s", client.peer)
        finally:
            await client.cleanup()


class _Link:
    """The ``ClientLink`` the hub sends deliveries through."""

    def __init__(self, client: _Client) -> None:
        self._client: _Client | None = client  # None once the connection is disposed of (no cycle left)
        self.pending: dict[int, int] = {}  # packet id → delivery id

    @property
    def window_free(self) -> int:
        client = self._client
        if client is None:
            return 0
        conn = client.conn
        return 0 if conn.closed else conn.window_free

    def send(self, delivery: Delivery) -> None:
        client = self._client
        if client is None:
            raise DeliveryError("client is gone", endpoint="mqtt", kind=FailureKind.TRANSIENT)
        conn = client.conn
        if conn.state is ConnectionState.CLOSED or client.identity is None:
            raise DeliveryError("client is not connected", endpoint=client.peer, kind=FailureKind.TRANSIENT)
        m = delivery.message
        if delivery.input_name is None:
            topic = device_bound_topic(client.identity, m)
        else:
            topic = module_input_topic(client.identity, delivery.input_name, m)
        props = NO_PROPERTIES  # a 3.1.1 client gets the topic's property bag only
        if conn.protocol_level == MQTT_50:
            values: dict[PropertyId, int | str | bytes] = {}
            ct = m.system_properties.get(SystemProperty.CONTENT_TYPE)
            if ct:
                values[PropertyId.CONTENT_TYPE] = ct
            cid = m.system_properties.get(SystemProperty.CORRELATION_ID)
            if cid:
                values[PropertyId.CORRELATION_DATA] = cid.encode()
            props = Properties(values, delivery_user_properties(m))
        try:
            packet_id = conn.send_message(topic, m.body, qos=1, properties=props, dup=delivery.redelivery)
        except PeerPacketTooLarge as exc:
            raise DeliveryError(str(exc), endpoint=client.peer, kind=FailureKind.PERMANENT) from exc
        except LocalProtocolError as exc:
            raise DeliveryError(str(exc), endpoint=client.peer, kind=FailureKind.TRANSIENT) from exc
        assert packet_id is not None
        self.pending[packet_id] = delivery.delivery_id
        # The hub sends a window of deliveries at a time: one write for all of them, not a syscall each.
        if not client._flush_scheduled:
            client.schedule_flush()


class _Client(asyncio.BufferedProtocol):
    """One connection: the protocol callbacks (reads, back-pressure), ingest groups, deliveries; ``run`` is the
    connection's task (handshake, then waiting for the end)."""

    def __init__(self, server: MqttServer, tls: ssl.SSLContext | None) -> None:
        self.server = server
        self.hub = server.hub
        self.settings = server.settings
        self.transport: asyncio.Transport | None = None
        self._tls = tls  # the handshake still to run in the connection's task, or None (plain TCP)
        # What the socket said before start_tls took it over (uvloop starts reading after connection_made even
        # when it paused reading): the ClientHello, handed to the TLS layer first. None: TLS is on or not used.
        self._early: bytearray | None = bytearray() if tls is not None else None
        self.peer = "?"  # address:port, for task names
        self.address = "?"  # the source address: the key of the pre-login caps, the throttle and refusal lines
        self._port: object = "?"
        self.ticket: Ticket | None = None  # this connection's place under the ConnectionLimiter's caps
        s = self.settings
        self.conn = ServerConnection(
            max_packet_size=s.max_packet_size,
            receive_maximum=s.receive_maximum,
            outbound_window=s.outbound_window,
            topic_cache_bytes=s.topic_cache_bytes,
        )
        self.identity: Identity | None = None
        self.auth_method = ""
        self.link = _Link(self)
        self.subscriptions: set[str] = set()
        self.registered = False
        self.clean_exit = False
        # topic -> (system, application properties) of a telemetry PUBLISH without MQTT 5 properties that the
        # ACL allowed: the same topic gives the same properties, so later ones skip parsing and checking it.
        # Bounded in bytes; only topics the ACL allowed and that made a message are kept.
        self._telemetry: BudgetDict[str, tuple[Mapping[str, str], Mapping[str, str | None]]] = BudgetDict(
            s.topic_cache_bytes
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        # Reads before the client is live (CONNECT, and what follows it while the hub authenticates).
        self._inbox: deque[bytes] = deque()
        self._inbox_bytes = 0
        self._data_waiter: asyncio.Future[None] | None = None
        self._live = False  # authenticated: reads go straight to _on_data
        self._ended = False  # no more reads are taken (closed, EOF, lost, keepalive, crash)
        self._end: asyncio.Future[None] = self._loop.create_future()  # set when _ended is
        self._lost: asyncio.Future[None] = self._loop.create_future()  # set by connection_lost
        self._groups_in_flight = 0
        self._writing_paused = False
        self._reading_paused = False
        self._keepalive: asyncio.TimerHandle | None = None
        self._not_reading: asyncio.TimerHandle | None = None  # armed while writing is paused (module docstring)
        self._last_read = 0.0
        self._quickack: Callable[[], None] | None = None  # re-arms TCP_QUICKACK (see the module docstring)
        self._quickack_sock: socket.socket | None = None
        self._refill_at = max(1, s.outbound_window // 4)

    # --- asyncio.BufferedProtocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple) and len(peername) >= 2:
            self.address = str(peername[0])
            self._port = peername[1]
            self.peer = f"{peername[0]}:{peername[1]}"
        admitted = self.server.limiter.admit(self.address)
        if isinstance(admitted, Cap):
            # Closed at once, before any handshake or buffer: a flood costs a descriptor for an instant.
            self._refused(RefusalReason.TOO_MANY_CONNECTIONS, cap=admitted.value)
            self._ended = True
            self.transport.abort()
            self._dispose()
            return
        self.ticket = admitted
        if self._tls is not None:
            self.transport.pause_reading()  # the ClientHello waits for start_tls (run)
        sock = transport.get_extra_info("socket")
        if _QUICKACK is not None and sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # A socket object of our own, on a duplicate of the descriptor (closed in connection_lost): uvloop's
            # transport socket builds and detaches a socket object for every setsockopt (~2.9 us a call here,
            # ~0.6 us this way, and it is called for most reads of a module that acks deliveries).
            own = socket.socket(sock.family, sock.type, sock.proto, fileno=os.dup(sock.fileno()))
            self._quickack_sock = own
            self._quickack = functools.partial(own.setsockopt, socket.IPPROTO_TCP, _QUICKACK, 1)
        self.server._start(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(self.server._read_buffer[:nbytes])
        if self._early is not None:  # TLS bytes before the handshake began: keep them for it (see __init__)
            self._early += data
            if self.transport is not None:
                self.transport.pause_reading()
            return
        if self._quickack is not None and self.link.pending:  # deliveries wait for acks (module docstring)
            try:
                self._quickack()
            except OSError:
                pass  # the peer is gone: the read's handling finds out
        self._received(data)

    def _on_acks(self, packet_ids: list[int]) -> None:
        """Settle the deliveries these (successful) PUBACKs acknowledge, then refill the window if it is time."""
        identity = self.identity
        if identity is None:
            return
        pending, delivered = self.link.pending, self.hub.delivered
        acked = False
        for packet_id in packet_ids:
            delivery_id = pending.pop(packet_id, None)
            if delivery_id is not None:
                delivered(identity, delivery_id, True)
                acked = True
        if acked:
            self._refill(identity)

    def _refill(self, identity: Identity) -> None:
        """After a read's acks: fill the window they freed in one go, one write, once a quarter of it is free.
        A client acks a few messages per read, and refilling two or three slots a time cost a socket write each
        (4 % of the hub's CPU in bench.ingest's telemetry). The other three quarters are still in flight, so the
        client never waits for it; a window that drains completely is always refilled."""
        if self.link.window_free >= self._refill_at:
            self.hub.link_ready(identity, self.link)

    def _received(self, data: bytes) -> None:
        if self._live:
            self._last_read = self._loop.time()
            try:
                self._on_data(data)
            except Exception:
                # A bug in handling this client's bytes ends this client only.
                log.exception("mqtt.client_crashed peer=%s", self.peer)
                self._finish()
            return
        if self._ended:
            return
        self._inbox.append(data)
        self._inbox_bytes += len(data)
        if self._inbox_bytes > _READ_SIZE:  # the handshake has not taken it yet: do not buffer without bound
            self._update_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._finish()
        # Keep the write side open until cleanup: acks of groups still being stored may go out (TLS cannot).
        return self.transport is not None and self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._not_reading is not None:
            self._not_reading.cancel()
            self._not_reading = None
        self._quickack = None
        if self._quickack_sock is not None:
            self._quickack_sock.close()  # the last descriptor of the socket: the kernel closes the connection now
            self._quickack_sock = None
        self._finish()
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
        self._refused(RefusalReason.NOT_READING, waited_s=limit)
        self.conn.close(ReasonCode.KEEP_ALIVE_TIMEOUT)
        if self.transport is not None:
            self.transport.abort()
        self._finish()

    # --- reading -------------------------------------------------------------------------------------------

    def _update_reading(self) -> None:
        """Read unless a limit says not to: the handshake's buffer, the groups in flight, the write buffer."""
        transport = self.transport
        if self._ended or transport is None or transport.is_closing():
            return  # once ended, reading stays paused (_finish) whatever frees up later
        pause = (
            self._writing_paused
            or self._groups_in_flight >= self.settings.max_groups_in_flight
            or (not self._live and self._inbox_bytes > _READ_SIZE)
        )
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _wake_reader(self) -> None:
        waiter = self._data_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _read(self) -> bytes:
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

    def _on_data(self, data: bytes) -> None:
        if self.link.pending:
            # A read of nothing but PUBACKs (most reads of a module that is being delivered to) skips the event
            # objects and the dispatch: it only settles deliveries.
            acked = self.conn.receive_acks(data)
            if acked is not None:
                self._on_acks(acked)
                return
        self._dispatch(self.conn.receive_data(data))
        if self.conn.closed:
            self._finish()

    def _finish(self) -> None:
        """Take no more reads; the connection's task goes on to clean up (and close the socket)."""
        if self._ended:
            return
        self._ended = True
        self._live = False
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        transport = self.transport
        if transport is not None and not transport.is_closing():
            with contextlib.suppress(RuntimeError, NotImplementedError):  # TLS after close_notify, for one
                transport.pause_reading()
        self.flush()
        self._wake_reader()
        if not self._end.done():
            self._end.set_result(None)

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
            self._refused(RefusalReason.KEEPALIVE_TIMEOUT, timeout_s=timeout)
            self.conn.close(ReasonCode.KEEP_ALIVE_TIMEOUT)
            self._finish()
            return
        self._keepalive = self._loop.call_at(due, self._check_keepalive)

    # --- writing -------------------------------------------------------------------------------------------

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
        if self.transport is not None:
            self.transport.close()

    # --- the connection's task -----------------------------------------------------------------------------

    async def run(self) -> None:
        s = self.settings
        timeout_s = s.busy_connect_timeout_s if self.server.limiter.busy else s.connect_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                if self._tls is not None and not await self._start_tls(self._tls, timeout_s):
                    return
                connect, pipelined = await self._handshake()
        except TimeoutError:
            self._refused(RefusalReason.CONNECT_TIMEOUT, client=self._claimed(), timeout_s=timeout_s)
            if self.transport is not None:
                self.transport.abort()  # nothing to say to it: no goodbye to wait for
            return
        if connect is None:
            return
        self._dispatch(pipelined)
        # What came while the hub authenticated (even if the client has hung up since), then live: from here
        # on buffer_updated handles every read.
        while self._inbox and not self.conn.closed:
            data = self._inbox.popleft()
            self._inbox_bytes -= len(data)
            self._dispatch(self.conn.receive_data(data))
        self._inbox.clear()
        self._inbox_bytes = 0
        if self.conn.closed:
            self._finish()
        self._live = not self._ended
        self._update_reading()
        if self._live and self.conn.keepalive_timeout_s is not None:
            self._last_read = self._loop.time()
            self._keepalive = self._loop.call_at(self._last_read + self.conn.keepalive_timeout_s, self._check_keepalive)
        await self._end
        self.flush()

    async def _start_tls(self, context: ssl.SSLContext, timeout_s: float) -> bool:
        """The TLS handshake on the accepted socket; False (socket closed) when it fails."""
        raw = self.transport
        assert raw is not None
        if self._ended or raw.is_closing():  # gone before its handshake began
            return False
        early, self._early = self._early, None
        if early:
            # Runs after start_tls has put its TLS protocol on the socket, before that protocol's connection_made
            # (both scheduled by start_tls, after this): the bytes wait in its input buffer for the handshake.
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
            # The protocol hears nothing of a handshake that failed (no connection_lost): end here.
            raw.abort()
            self._finish()
            if not self._lost.done():
                self._lost.set_result(None)
            if isinstance(exc, OSError):  # ssl.SSLError, a reset, the handshake timeout (ConnectionAbortedError)
                self._refused(RefusalReason.TLS_HANDSHAKE_FAILED, error=type(exc).__name__)
                return False
            raise
        if tls is None:  # closed meanwhile
            raw.abort()
            return False
        self.transport = tls
        return True

    async def _handshake(self) -> tuple[Connect | None, list[Event]]:
        while True:
            data = await self._read()
            if not data:
                return None, []
            events = self.conn.receive_data(data)
            for event in events:
                if isinstance(event, ProtocolFailed):
                    self._protocol_failed(event)
                    self.flush()
                    return None, []
                if isinstance(event, ConnectRequested):
                    return await self._authenticate(event.connect)

    async def _authenticate(self, c: Connect) -> tuple[Connect | None, list[Event]]:
        # Throttled per source address and per claimed client id (a key of 128 characters at most).
        keys = (self.address, c.client_id[:128])
        server = self.server
        if server.address_throttle.blocked(keys[0]) or server.throttle.blocked(keys[1]):
            self._refused(RefusalReason.LOGIN_THROTTLED, client=_shown(c.client_id))
            self.conn.refuse(ReasonCode.CONNECTION_RATE_EXCEEDED, reason="too many failed logins; try again later")
            self.flush()
            return None, []
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
        thumbprint, cn, verified = self._peer_certificate()
        creds = Credentials(claimed, c.username, c.password, thumbprint, cn, verified)
        try:
            result = await self.hub.authenticate(creds)
        except AuthenticationError as exc:
            return self._refuse(keys, ReasonCode.NOT_AUTHORIZED, "authentication failed", c, detail=exc)
        if result.identity != claimed:
            return self._refuse(
                keys, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "client id is not the authenticated identity", c
            )
        server.throttle.succeeded(keys[1])
        if self.ticket is not None:
            self.ticket.authenticated()  # no longer counted against the pre-login caps
        self.identity = result.identity
        self.auth_method = result.auth_method
        old = self.server._clients.get(self.identity.id)
        if old is not None:
            log.info("mqtt.session_takeover client=%s", self.identity)
            old.take_over()
        self.server._clients[self.identity.id] = self
        info = await self.hub.connect(self.identity, self.link, clean_session=c.clean_start)
        self.registered = True
        pipelined = self.conn.accept(session_present=info.session_present)
        self.flush()
        log.info("mqtt.connected client=%s level=%d auth=%s", self.identity, c.protocol_level, self.auth_method)
        self.hub.link_ready(self.identity, self.link)
        return c, pipelined

    def _refuse(
        self, keys: tuple[str, str], reason: int, text: str, c: Connect, *, detail: object = None
    ) -> tuple[None, list[Event]]:
        """Refuse the login: a failing CONNACK with ``reason`` and ``text``, counted by the login throttle."""
        self.server.address_throttle.failed(keys[0])
        self.server.throttle.failed(keys[1])
        why = _LOGIN_REFUSALS.get(reason, RefusalReason.BAD_CREDENTIALS)
        extra = {"detail": _shown(str(detail), 200)} if detail is not None else {}
        self._refused(why, client=_shown(c.client_id), why=repr(text), **extra)
        self.conn.refuse(reason, reason=text)
        self.flush()
        return None, []

    def _refused(self, reason: RefusalReason | str, *, client: str | None = None, **detail: object) -> None:
        """One refusal line through the server's RefusalLog: keyed by source address, naming the client."""
        if client is None and self.identity is not None:
            client = self.identity.id
        self.server.refusals.refused(reason, peer=self.address, client=client, port=self._port, **detail)

    def _claimed(self) -> str | None:
        c = self.conn.connect
        return _shown(c.client_id) if c is not None else None

    def _protocol_failed(self, event: ProtocolFailed) -> None:
        error = event.error
        too_large = error.reason_code == ReasonCode.PACKET_TOO_LARGE
        why = RefusalReason.PACKET_TOO_LARGE if too_large else RefusalReason.MALFORMED_PACKET
        code = error.reason_code if error.reason_code is not None else ReasonCode.PROTOCOL_ERROR
        self._refused(why, client=self._claimed(), code=f"0x{code:02x}", detail=_shown(str(error), 200))

    def _peer_certificate(self) -> tuple[str | None, str | None, bool]:
        assert self.transport is not None
        ssl_object = self.transport.get_extra_info("ssl_object")
        if ssl_object is None:
            return None, None, False
        der = ssl_object.getpeercert(binary_form=True)
        if not der:
            return None, None, False
        cn = None
        info = ssl_object.getpeercert()
        if info:
            for rdn in info.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        cn = value
        return hashlib.sha256(der).hexdigest(), cn, bool(info)

    def take_over(self) -> None:
        """A newer connection of the same identity won: say so and close."""
        self.conn.close(ReasonCode.SESSION_TAKEN_OVER)
        self.clean_exit = True  # a takeover does not publish the will [MQTT-3.1.4-3 notwithstanding, as IoT Hub]
        self._finish()
        self.close()

    def _dispatch(self, events: list[Event]) -> None:
        group: list[MessageReceived] = []
        acked = False
        for event in events:
            if isinstance(event, MessageReceived):
                group.append(event)
            elif isinstance(event, SubscribeRequested):
                self._on_subscribe(event)
            elif isinstance(event, UnsubscribeRequested):
                codes: list[int] = []
                for f in event.unsubscribe.topic_filters:
                    codes.append(ReasonCode.SUCCESS if f in self.subscriptions else ReasonCode.NO_SUBSCRIPTION_EXISTED)
                    self.subscriptions.discard(f)
                self.conn.answer_unsubscribe(event.unsubscribe.packet_id, codes)
            elif isinstance(event, DeliveryAcked):
                delivery_id = self.link.pending.pop(event.packet_id, None)
                if delivery_id is not None and self.identity is not None:
                    self.hub.delivered(self.identity, delivery_id, event.reason_code < 0x80)
                    acked = True
            elif isinstance(event, Disconnected):
                self.clean_exit = not event.publish_will
            elif isinstance(event, ProtocolFailed):
                self._protocol_failed(event)  # the connection is closed; run() ends after flushing the goodbye
        if acked and self.identity is not None:
            self._refill(self.identity)  # once for all the acks of this read
        if group:
            self._groups_in_flight += 1
            task = self._loop.create_task(self._ingest(group), name=f"mqtt.ingest {self.identity}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            if self._groups_in_flight >= self.settings.max_groups_in_flight:
                self._update_reading()
        self.flush()

    def _on_subscribe(self, event: SubscribeRequested) -> None:
        assert self.identity is not None
        s = self.settings
        codes: list[int] = []
        for sub in event.subscribe.subscriptions:
            f = sub.topic_filter
            if len(f) > s.max_filter_length or len(f.encode()) > s.max_filter_length:
                self._refused(RefusalReason.FILTER_TOO_LONG, length=len(f.encode()), limit=s.max_filter_length)
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
            elif f not in self.subscriptions and len(self.subscriptions) >= s.max_subscriptions:
                self._refused(RefusalReason.TOO_MANY_SUBSCRIPTIONS, filter=_shown(f), limit=s.max_subscriptions)
                codes.append(ReasonCode.QUOTA_EXCEEDED)
            elif s.acl.may_subscribe(self.identity, f):
                self.subscriptions.add(f)
                codes.append(min(sub.qos, 1))
            else:
                self._refused(RefusalReason.NOT_AUTHORIZED, subscribe=_shown(f))
                codes.append(ReasonCode.NOT_AUTHORIZED)
        self.conn.answer_subscribe(event.subscribe.packet_id, codes)

    async def _ingest(self, group: list[MessageReceived]) -> None:
        try:
            await self._ingest_group(group)
        except StoreError as exc:
            log.warning("mqtt.ingest_failed client=%s detail=%s", self.identity, exc)
            self.conn.close(ReasonCode.UNSPECIFIED_ERROR, reason="store failure")
            self._finish()
            self.close()
        finally:
            self._groups_in_flight -= 1
            if self._reading_paused:
                self._update_reading()

    async def _ingest_group(self, group: list[MessageReceived]) -> None:
        identity = self.identity
        assert identity is not None
        now = self.settings.clock.time()
        settle: list[tuple[int | None, int]] = []  # (ticket, reason code), in arrival order
        texts: dict[int, str] | None = None  # ticket -> Reason String of a refusal made here (QoS 1 and 2)
        to_store: list[Message] = []
        known = self._telemetry
        for event in group:
            p = event.publish
            props = known.get(p.topic)
            if props is not None and p.properties is NO_PROPERTIES:
                # A telemetry topic this client used before: its properties are known.
                settle.append((event.ticket, -1 - len(to_store)))
                to_store.append(Message(p.payload, props[1], props[0]))
                continue
            if props is None:
                twin = parse_twin_request(p.topic)
                if twin is not None:
                    await self._on_twin(identity, twin, p)
                    settle.append((event.ticket, 0))
                    continue
                refusal = self._publish_refusal(identity, p.topic)
                if refusal is not None:
                    if event.ticket is not None:
                        texts = texts or {}
                        texts[event.ticket] = refusal[1]
                    settle.append((event.ticket, refusal[0]))
                    continue
            try:
                msg = self._message(identity, p, now, props)
            except InvalidMessageError as exc:
                code = ReasonCode.TOPIC_NAME_INVALID if isinstance(exc, TopicError) else 0x83
                self._refused(exc.reason, topic=_shown(p.topic), detail=_shown(str(exc), 200))
                settle.append((event.ticket, code))
                continue
            settle.append((event.ticket, -1 - len(to_store)))  # placeholder: index into the hub's outcomes
            to_store.append(msg)
            if props is None:
                # Without MQTT 5 properties a message's properties follow from the topic alone (the identity
                # and auth method are the connection's): later messages on it share these (immutable) maps.
                if p.properties is not NO_PROPERTIES:
                    msg = self._message(identity, msgspec.structs.replace(p, properties=NO_PROPERTIES), now, None)
                known.remember(p.topic, (msg.system_properties, msg.properties), _ENTRY_OVERHEAD + 3 * len(p.topic))
        try:
            outcomes = await self.hub.ingest(identity, to_store) if to_store else []
        except StorageIOError:
            # Nothing of the group was stored and the store stays usable (the store logged why): a refusal of
            # these messages, as for any other, not of the connection.
            outcomes = [_STORE_UNAVAILABLE] * len(to_store)
        answers: list[tuple[int, int, str | None]] = []
        for ticket, reason in settle:
            text = None
            if reason < 0:
                outcome = outcomes[-1 - reason]
                if isinstance(outcome, Rejected):
                    reason = REJECT_REASONS.get(outcome.reason, 0x80)
                    text = outcome.detail or None
                    self._refused(outcome.reason, qos=0 if ticket is None else 1, code=f"0x{reason:02x}")
                else:
                    reason = 0
            elif reason and texts is not None and ticket is not None:
                text = texts.get(ticket)
            if ticket is None:
                continue  # QoS 0: nothing to answer (a refusal was logged where it was made)
            answers.append((ticket, reason, text))
        if answers:
            self.conn.settle_many(answers)
        self.flush()
        if self.conn.closed:
            self._finish()
            self.close()

    def _publish_refusal(self, identity: Identity, topic: str) -> tuple[int, str] | None:
        """Why a PUBLISH on ``topic`` (not a twin request, not known) is refused, logged; None if it is not."""
        limit = self.settings.max_topic_length
        if len(topic) > limit:
            self._refused(RefusalReason.TOPIC_TOO_LONG, length=len(topic), limit=limit)
            return ReasonCode.TOPIC_NAME_INVALID, f"topic name over {limit} characters"
        if is_method_response(topic):
            # Direct methods are not offered yet, so no call is ever pending: never route an answer as telemetry.
            self._refused(RefusalReason.NO_PENDING_CALL, topic=_shown(topic))
            return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "no direct method call is pending"
        if not self.settings.acl.may_publish(identity, topic):
            self._refused(RefusalReason.NOT_AUTHORIZED, topic=_shown(topic))
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
            self._respond(twin_response_topic(200, twin.rid), json.dumps(doc).encode())
            return
        try:
            # The hub parses the raw patch (edgehub.hub.twins): bounded size and depth before any json.loads.
            version = await self.hub.update_reported(identity, p.payload)
        except TwinError as exc:  # refused and logged by the hub; the device gets IoT Hub's status
            self._respond(twin_response_topic(exc.status, twin.rid), b"")
            return
        self._respond(twin_response_topic(204, twin.rid, version=version), b"")

    def _respond(self, topic: str, payload: bytes) -> None:
        if self.conn.closed or not any(topic_matches(f, topic) for f in self.subscriptions):
            return
        self.conn.send_message(topic, payload, qos=0)

    async def cleanup(self) -> None:
        try:
            for task in list(self._tasks):
                if not task.done():
                    # Let stores finish: the message may be durable; its ack just cannot go out any more.
                    with contextlib.suppress(Exception):
                        await task
            identity = self.identity
            if identity is not None and self.server._clients.get(identity.id) is self:
                del self.server._clients[identity.id]
            if identity is not None and self.registered:
                await self._publish_will(identity)
                await self.hub.disconnect(identity, self.link)
        finally:
            # Also when cancelled (server shutdown): the socket never outlives its client task.
            for task in list(self._tasks):
                task.cancel()
            self._finish()
            self.close()
            # The buffers go now, not when the socket is gone (a TLS goodbye may take _TLS_SHUTDOWN_S).
            self._inbox.clear()
            self._inbox_bytes = 0
            self.conn.discard_input()
            try:
                with contextlib.suppress(Exception):
                    await self._lost
            finally:
                self._dispose()

    def _dispose(self) -> None:
        """Let go of everything that could lead back here, so that reference counting alone frees this client
        and its buffers once the loop lets go of it: ``edgehub run`` runs the cycle collector rarely (tune_gc),
        and 500 timed-out connections' cycles held ~250 MB. Last thing a connection does."""
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None
        self.link._client = None  # the hub may hold the link a while longer; it no longer holds this client
        for handle in (self._keepalive, self._not_reading):
            if handle is not None:
                handle.cancel()
        self._keepalive = self._not_reading = None
        self._quickack = None
        if self._quickack_sock is not None:
            self._quickack_sock.close()
            self._quickack_sock = None
        self._tasks.clear()
        self._inbox.clear()
        self._inbox_bytes = 0
        self._data_waiter = None
        self._telemetry.clear()
        self.transport = None

    async def _publish_will(self, identity: Identity) -> None:
        c = self.conn.connect
        if self.clean_exit or c is None or c.will is None:
            return
        will = c.will
        if not self.settings.acl.may_publish(identity, will.topic):
            return
        try:
            msg = message_from_publish(
                identity, will.topic, will.payload, auth_method=self.auth_method, now_s=self.settings.clock.time()
            )
            await self.hub.ingest(identity, [msg])
            log.info("mqtt.will_published client=%s topic=%s", identity, will.topic)
        except EdgeHubError as exc:
            log.info("mqtt.will_dropped client=%s detail=%s", identity, exc)
