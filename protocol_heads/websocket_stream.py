"""The WebSocket listener's connections (``protocol_heads.websocket`` says what they do and the bounds they keep):
``UpgradeSocket`` until the upgrade (admission and TLS are ``SocketSide``'s, the HTTP request and its refusals
are its own), ``WebSocketStream`` after it (the head's transport above, the socket's protocol below, wsproto
doing the framing). Loaded at the listener's first accepted connection (``WebSocketServer._socket``).
"""

from __future__ import annotations

import asyncio
import ssl
from http import HTTPStatus
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import RemoteProtocolError

from edgehub.core.refusals import RefusalLog, RefusalReason
from edgehub.hub import Ticket
from protocol_heads.listeners import HeadServer
from protocol_heads.socket_side import SocketSide
from protocol_heads.websocket import WebSocketServer, WebSocketSettings

__all__ = ["UpgradeSocket", "WebSocketStream"]


def _http_refusal(status: HTTPStatus, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """The whole HTTP response refusing an upgrade (no body; the connection closes after it)."""
    lines = [f"HTTP/1.1 {status.value} {status.phrase}", "Connection: close", "Content-Length: 0"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


class _Outgoing:
    """What the upgrade has to send (the 101, or a refusal), for ``SocketSide.flush``."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = bytearray()

    def data_to_send(self) -> bytes:
        data, self.pending = bytes(self.pending), bytearray()
        return data


class UpgradeSocket(SocketSide[WebSocketServer, WebSocketSettings, _Outgoing], asyncio.Protocol):
    """One connection until its upgrade: admission, TLS (``SocketSide``), the HTTP request, then the hand-over to a
    head (``WebSocketStream``) or an HTTP refusal."""

    def __init__(self, server: WebSocketServer, tls: ssl.SSLContext | None) -> None:
        super().__init__(server, tls)
        self.conn = _Outgoing()
        self._ws: WSConnection | None = WSConnection(ConnectionType.SERVER)
        self._request_bytes = 0
        self._held: list[bytes] | None = None  # reads while start_tls runs (the AMQP head's reason: see there)
        self._outcome: asyncio.Future[tuple[HeadServer[Any, Any], str] | None] = self._loop.create_future()
        self._handed_over = False

    # --- asyncio.Protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._admit(transport):
            self.server.start_client(self)

    def data_received(self, data: bytes) -> None:
        if self._early is not None:
            self._keep_early(data)
            return
        if self._held is not None:
            self._held.append(data)
            return
        if self._ended:
            return
        if self._outcome.done():  # read anyway after the 101 (uvloop): wsproto keeps it for the head
            assert self._ws is not None
            self._ws.receive_data(data)
            return
        self._request_bytes += len(data)
        if self._request_bytes > self.settings.max_upgrade_request_bytes:
            self._refuse(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                RefusalReason.REQUEST_TOO_LARGE,
                limit=self.settings.max_upgrade_request_bytes,
            )
            return
        assert self._ws is not None
        try:
            self._ws.receive_data(data)
            for event in self._ws.events():
                if isinstance(event, Request):
                    self._upgrade(event)
                    return
        except RemoteProtocolError as exc:
            status: HTTPStatus = HTTPStatus.BAD_REQUEST
            headers: tuple[tuple[str, str], ...] = ()
            hint = exc.event_hint  # wsproto's answer: 426 and the version it speaks for another version
            if isinstance(hint, RejectConnection):
                status = HTTPStatus(hint.status_code)
                headers = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in hint.headers)
            self._refuse(status, RefusalReason.MALFORMED_REQUEST, headers=headers, error=str(exc))

    def eof_received(self) -> bool:
        self.finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish()
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False

    # --- the upgrade ---------------------------------------------------------------------------------------

    def _upgrade(self, request: Request) -> None:
        """Refuse the request (path, subprotocol), or accept it and name the head it goes to."""
        path = request.target.split("?", 1)[0]
        if path != self.settings.path:
            self._refuse(HTTPStatus.NOT_FOUND, RefusalReason.NOT_FOUND, path=path)
            return
        chosen = next((p for p in request.subprotocols if p in self.server.heads), None)
        if chosen is None:
            self._refuse(
                HTTPStatus.BAD_REQUEST,
                RefusalReason.INVALID_REQUEST,
                subprotocols=",".join(request.subprotocols) or "none",
                served=",".join(self.server.heads),
            )
            return
        assert self._ws is not None
        self.conn.pending += self._ws.send(AcceptConnection(subprotocol=chosen))
        self.flush()
        if self.transport is not None:
            # What the client sends after the 101 waits in the socket for the head (WebSocketStream.start).
            self.transport.pause_reading()
        self._outcome.set_result((self.server.heads[chosen], chosen))

    def _refuse(
        self,
        status: HTTPStatus,
        reason: RefusalReason,
        *,
        headers: tuple[tuple[str, str], ...] = (),
        **detail: object,
    ) -> None:
        self.refused(reason, client=None, status=status.value, **detail)
        self.conn.pending += _http_refusal(status, headers)
        if not self._outcome.done():
            self._outcome.set_result(None)
        self.finish()

    def _tls_starting(self) -> None:
        self._held = []

    def _tls_started(self) -> None:
        held, self._held = self._held, None
        for data in held or ():
            self.data_received(data)

    # --- SocketSide ----------------------------------------------------------------------------------------

    def _update_reading(self) -> None:
        pass  # nothing paces an upgrade but its size bound (data_received)

    def _stop_timers(self) -> None:
        pass

    def _claimed(self) -> str | None:
        return None

    def _login_timed_out(self) -> None:
        self.conn.pending += _http_refusal(HTTPStatus.REQUEST_TIMEOUT)
        self.flush()

    async def _log_in(self) -> bool:
        """Wait for the upgrade request's outcome; accepted, hand the connection to its head. Always False: the
        task ends here either way (a handed-over connection lives on in the head's task)."""
        waits: set[asyncio.Future[Any]] = {self._outcome, self._end}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        outcome = self._outcome.result() if self._outcome.done() else None
        transport = self.transport
        if outcome is None or self._ended or transport is None or transport.is_closing():
            return False
        head, subprotocol = outcome
        assert self._ws is not None
        assert self.ticket is not None
        ticket, self.ticket = self.ticket, None
        ticket.authenticated()  # no longer pending here: pending in the head until its login (module docstring)
        stream = WebSocketStream(
            transport,
            self._ws,
            settings=self.settings,
            refusals=self.server.refusals,
            address=self.address,
            ticket=ticket,
            subprotocol=subprotocol,
        )
        self._ws = None
        self._handed_over = True
        transport.set_protocol(stream)
        stream.set_protocol(head.adopt(stream))
        if self._writing_paused:
            stream.pause_writing()
        stream.start()
        return False

    async def cleanup(self) -> None:
        if self._handed_over:
            self.transport = None
            return
        self.finish()
        self.flush()
        self.close()
        try:
            await self.goodbye()
        finally:
            self._ws = None
            self.transport = None
            self.dispose()


class WebSocketStream(asyncio.Transport, asyncio.Protocol):
    """An upgraded connection: the head's transport above (what it writes goes out as one binary message each;
    what the client's binary messages carry is handed to the head as reads), the real socket's protocol below.
    ``start`` begins the hand-off once the head's socket side has had ``connection_made``."""

    def __init__(
        self,
        real: asyncio.Transport,
        ws: WSConnection,
        *,
        settings: WebSocketSettings,
        refusals: RefusalLog,
        address: str,
        ticket: Ticket,
        subprotocol: str,
    ) -> None:
        super().__init__()
        self._real = real
        self._ws = ws
        self._settings = settings
        self._refusals = refusals  # the listener's (not the UpgradeSocket, which is let go of at the hand-over)
        self._address = address
        self._ticket: Ticket | None = ticket
        self.subprotocol = subprotocol
        self._head: asyncio.BaseProtocol | None = None
        self._loop = asyncio.get_running_loop()
        self._paused = False  # the head paused reading
        self._closing = False
        self._lost = False
        self._frame_bytes = 0
        self._message_bytes = 0
        self._message_frames = 0
        self._drain_scheduled = False

    # --- the head's side: asyncio.Transport ------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._real.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._closing or self._real.is_closing()

    def close(self) -> None:
        """Say goodbye (a close frame, 1000), then close the socket as the head would close its own."""
        if self.is_closing():
            return
        self._close_socket(CloseReason.NORMAL_CLOSURE)

    def abort(self) -> None:
        self._closing = True
        self._real.abort()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._head = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._head is not None
        return self._head

    def is_reading(self) -> bool:
        return not self._paused

    def pause_reading(self) -> None:
        if self._paused:
            return
        self._paused = True
        if not self._real.is_closing():
            self._real.pause_reading()

    def resume_reading(self) -> None:
        if not self._paused:
            return
        self._paused = False
        if not self._real.is_closing():
            self._real.resume_reading()
        self._schedule_drain()  # what was decoded before the pause (never within the head's own call)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.is_closing() or not data:
            return
        if self._ws.state is not ConnectionState.OPEN:
            return
        self._real.write(self._ws.send(Message(data=bytes(data))))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("a WebSocket has no half-close")

    def get_write_buffer_size(self) -> int:
        return self._real.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._real.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._real.get_write_buffer_limits()

    # --- the socket's side: asyncio.Protocol ----------------------------------------------------------------

    def start(self) -> None:
        """The head has the stream (``set_protocol``): hand it what came after the upgrade request, and read on
        (reading paused at the 101) unless the head has paused it meanwhile."""
        if self._closing:
            return
        if not self._paused:
            self._real.resume_reading()
        self._drain()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # pragma: no cover - set_protocol'd in
        raise RuntimeError("a WebSocketStream takes over a connected socket (set_protocol)")

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._ws.receive_data(data)
        if not self._paused:
            self._drain()

    def eof_received(self) -> bool:
        """The client hung up without a close frame (as most MQTT clients do after DISCONNECT): what was decoded
        goes to the head (unless it paused), then the head's own end of stream. No refusal: nothing was wrong."""
        if not self._paused:
            self._drain()
        self._closing = True
        self._head_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        if self._ticket is not None:
            self._ticket.release()
            self._ticket = None
        head = self._head
        if head is not None:
            head.connection_lost(exc)
        self._head = None

    def pause_writing(self) -> None:
        if self._head is not None:
            self._head.pause_writing()

    def resume_writing(self) -> None:
        if self._head is not None:
            self._head.resume_writing()

    # --- frames --------------------------------------------------------------------------------------------

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._scheduled_drain)

    def _scheduled_drain(self) -> None:
        self._drain_scheduled = False
        if not self._paused:
            self._drain()

    def _drain(self) -> None:
        """Hand the head what wsproto has decoded, event by event, until it pauses or there is no more."""
        if self._head is None:
            return
        for event in self._ws.events():
            self._handle(event)
            if self._paused or self._closing or self._head is None:
                return

    def _handle(self, event: Event) -> None:
        s = self._settings
        if isinstance(event, BytesMessage):
            self._frame_bytes += len(event.data)
            self._message_bytes += len(event.data)
            if event.frame_finished:
                self._message_frames += 1
            if self._frame_bytes > s.max_frame_bytes:
                self._refuse(RefusalReason.PACKET_TOO_LARGE, CloseReason.MESSAGE_TOO_BIG, limit=s.max_frame_bytes)
                return
            if self._message_bytes > s.max_message_bytes or self._message_frames > s.max_message_frames:
                self._refuse(
                    RefusalReason.MESSAGE_TOO_LARGE,
                    CloseReason.MESSAGE_TOO_BIG,
                    limit=s.max_message_bytes,
                    frames_limit=s.max_message_frames,
                )
                return
            if event.frame_finished:
                self._frame_bytes = 0
            if event.message_finished:
                self._message_bytes = self._message_frames = 0
            if event.data:
                self._feed(event.data)
        elif isinstance(event, TextMessage):
            self._refuse(RefusalReason.MALFORMED_PACKET, CloseReason.UNSUPPORTED_DATA, error="text frame")
        elif isinstance(event, Ping):
            self._real.write(self._ws.send(event.response()))
        elif isinstance(event, CloseConnection):
            if self._ws.state is ConnectionState.REMOTE_CLOSING:  # the client's goodbye: ours back
                self._real.write(self._ws.send(event.response()))
                self._closing = True
                self._head_eof()
                self._real.close()
            else:  # wsproto's word for bad framing (unmasked, a reserved opcode or bit, a long control frame)
                self._refuse(RefusalReason.MALFORMED_PACKET, CloseReason(event.code), error=event.reason or "")

    def _feed(self, data: bytes | bytearray) -> None:
        """Hand ``data`` to the head as a read from its socket (a buffered protocol's way, or a plain one's)."""
        head = self._head
        if isinstance(head, asyncio.BufferedProtocol):
            view = memoryview(data)
            while view and self._head is not None:
                buf = memoryview(head.get_buffer(len(view)))
                n = min(len(buf), len(view))
                buf[:n] = view[:n]
                head.buffer_updated(n)
                view = view[n:]
        elif isinstance(head, asyncio.Protocol):
            head.data_received(bytes(data))

    def _head_eof(self) -> None:
        head = self._head
        if isinstance(head, asyncio.Protocol | asyncio.BufferedProtocol):
            head.eof_received()

    def _refuse(self, reason: RefusalReason, code: CloseReason, **detail: object) -> None:
        """One refusal line (keyed by the source address, naming the head's client once it has logged in), the
        close frame with ``code``, and the end of the head's stream."""
        client = getattr(self._head, "client_id", None)
        port = (self.get_extra_info("peername") or ("?", "?"))[1]
        self._refusals.refused(reason, peer=self._address, client=client, port=port, close_code=int(code), **detail)
        self._close_socket(code)
        self._head_eof()

    def _close_socket(self, code: CloseReason) -> None:
        self._closing = True
        if self._ws.state is ConnectionState.OPEN:
            self._real.write(self._ws.send(CloseConnection(code=code)))
        self._real.close()
        # asyncio's TLS layer with reading paused waits for reading to resume before it shuts down (SocketSide.close
        # says more); what it still decrypts is dropped (_closing).
        try:
            self._real.resume_reading()
        except (RuntimeError, NotImplementedError):
            pass
