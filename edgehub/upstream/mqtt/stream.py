"""How the MQTT upstream reaches its broker when plain TCP (and TLS) is not the way: through an HTTP CONNECT proxy,
over a WebSocket (``ws://`` or ``wss://host:port/path``, subprotocol ``mqtt``), or both, for sites where only 443
leaves (``dial``). The ``Connection`` on top reads and writes the same MQTT bytes either way: over a WebSocket it
sees a ``WebSocketTransport``, which carries each write as one binary message and hands it each message's bytes
as they come (wsproto does the framing).

Order on the wire: TCP to the proxy (or the broker), ``CONNECT host:port`` and its ``200``, TLS to the broker
(the certificate checked for the broker's name, never the proxy's), the WebSocket upgrade, then MQTT.

Invariants: every step runs under the caller's timeout (``connect_timeout_s``, CONNACK included); what the proxy
or the broker answers before MQTT is bounded (``MAX_ANSWER_BYTES``), and an answer that is no success is a
``TransportError`` naming the step and the status (401/407: the proxy wants other credentials, PERMANENT; the
rest TRANSIENT). The proxy's credentials go only into the CONNECT request's ``Proxy-Authorization`` (never into a log
line or the twin). Once handed over, a socket belongs to the ``Connection``: its loss is the connection's loss.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import RemoteProtocolError

from edgehub.core import FailureKind, TransportError
from edgehub.upstream.mqtt.settings import ProxySettings

__all__ = ["MAX_ANSWER_BYTES", "WebSocketTransport", "dial"]

MAX_ANSWER_BYTES = 16 * 1024  # the proxy's answer to CONNECT, and the broker's to the upgrade, headers included
SUBPROTOCOL = "mqtt"


class _Handshake(asyncio.Protocol):
    """The socket's protocol until MQTT begins: it keeps what was read, for the step that waits on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.lost: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's too)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self.lost = ConnectionResetError("closed by the far side")
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("closed by the far side")
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def more(self, step: str) -> None:
        """Wait for the next read; ``TransportError`` if the socket is gone or the answer is over its bound."""
        if self.lost is not None:
            raise TransportError(f"{step}: {self.lost!r}", kind=FailureKind.TRANSIENT) from self.lost
        if len(self.buffer) > MAX_ANSWER_BYTES:
            raise TransportError(f"{step}: answer over {MAX_ANSWER_BYTES} bytes", kind=FailureKind.TRANSIENT)
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


async def _proxy_connect(shake: _Handshake, proxy: ProxySettings, host: str, port: int) -> None:
    """``CONNECT host:port`` through ``proxy``; returns once it answered 200 (what follows is the broker's)."""
    assert shake.transport is not None
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.username is not None or proxy.password is not None:
        basic = base64.b64encode(f"{proxy.username or ''}:{proxy.password or ''}".encode()).decode("ascii")
        lines.append(f"Proxy-Authorization: Basic {basic}")
    shake.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    step = f"proxy {proxy.host}:{proxy.port}"
    while (end := shake.buffer.find(b"\r\n\r\n")) < 0:
        await shake.more(step)
    head, rest = bytes(shake.buffer[:end]), bytes(shake.buffer[end + 4 :])
    shake.buffer = bytearray(rest)
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise TransportError(f"{step}: not an HTTP answer to CONNECT: {status_line[:80]!r}", kind=FailureKind.TRANSIENT)
    status = int(parts[1])
    if status != 200:
        # 407 (tinyproxy: 401): credentials missing or wrong, which wait for an operator; the rest (403: the proxy
        # forbids that port, 502: it cannot reach the broker) may pass
        kind = FailureKind.PERMANENT if status in (401, 407) else FailureKind.TRANSIENT
        raise TransportError(f"{step} refused CONNECT {authority}: {status_line[:80]!r}", kind=kind)


async def _upgrade(shake: _Handshake, host: str, port: int, path: str) -> WSConnection:
    """The WebSocket upgrade to ``path`` (subprotocol ``mqtt``); returns the open connection."""
    assert shake.transport is not None
    ws = WSConnection(ConnectionType.CLIENT)
    shake.transport.write(ws.send(Request(host=f"{host}:{port}", target=path, subprotocols=[SUBPROTOCOL])))
    step = f"WebSocket upgrade at {host}:{port}{path}"
    while True:
        try:
            if shake.buffer:  # never b"": to h11 that is the end of the connection
                ws.receive_data(bytes(shake.buffer))
                shake.buffer.clear()
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    return ws
                if isinstance(event, RejectConnection):
                    raise TransportError(f"{step}: refused with {event.status_code}", kind=FailureKind.TRANSIENT)
        except RemoteProtocolError as exc:
            raise TransportError(f"{step}: {exc}", kind=FailureKind.TRANSIENT) from exc
        await shake.more(step)


async def dial(
    protocol: asyncio.Protocol,
    *,
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
    proxy: ProxySettings | None,
    websocket_path: str | None,
) -> asyncio.Transport:
    """Connect ``protocol`` to ``host:port`` through ``proxy`` (if any), TLS (if ``tls``), a WebSocket at
    ``websocket_path`` (if any), in that order (module docstring). Returns the transport ``protocol`` was given.
    Raises ``TransportError`` for a refusal of a step, ``OSError`` for the socket's own failures."""
    loop = asyncio.get_running_loop()
    shake = _Handshake()
    first = (proxy.host, proxy.port) if proxy is not None else (host, port)
    transport, _ = await loop.create_connection(lambda: shake, *first)
    try:
        if proxy is not None:
            await _proxy_connect(shake, proxy, host, port)
        if tls is not None:
            early = bytes(shake.buffer)  # a broker speaks after our ClientHello: nothing can be here
            if early:
                raise TransportError("the broker spoke before TLS began", kind=FailureKind.TRANSIENT)
            secured = await loop.start_tls(transport, shake, tls, server_hostname=host)
            if secured is None:
                raise TransportError(f"{host}:{port} closed during the TLS handshake", kind=FailureKind.TRANSIENT)
            transport = secured
            shake.transport = secured
        if websocket_path is None:
            leftover = bytes(shake.buffer)
            transport.set_protocol(protocol)
            protocol.connection_made(transport)
            if leftover:
                protocol.data_received(leftover)
            return transport
        ws = await _upgrade(shake, host, port, websocket_path)
        stream = WebSocketTransport(transport, ws)
        transport.set_protocol(stream)
        stream.set_protocol(protocol)
        protocol.connection_made(stream)
        stream.data_received(b"")  # MQTT that came with the 101
        return stream
    except BaseException:
        transport.abort()
        raise


class WebSocketTransport(asyncio.Transport, asyncio.Protocol):
    """A client WebSocket as the ``Connection``'s transport (module docstring): each write one binary message,
    each message's bytes handed on as they come; pings answered; a text frame or bad framing closes the socket
    (the ``Connection`` sees it lost, and what it had in flight fails as on any loss)."""

    def __init__(self, real: asyncio.Transport, ws: WSConnection) -> None:
        super().__init__()
        self._real = real
        self._ws = ws
        self._protocol: asyncio.Protocol | None = None
        self._closing = False

    # --- the Connection's side -------------------------------------------------------------------------------

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, asyncio.Protocol)
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._real.get_extra_info(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.is_closing() and data and self._ws.state is ConnectionState.OPEN:
            self._real.write(self._ws.send(Message(data=bytes(data))))

    def is_closing(self) -> bool:
        return self._closing or self._real.is_closing()

    def close(self) -> None:
        self._close(CloseReason.NORMAL_CLOSURE)

    def abort(self) -> None:
        self._closing = True
        self._real.abort()

    def is_reading(self) -> bool:
        return self._real.is_reading()

    def pause_reading(self) -> None:
        self._real.pause_reading()

    def resume_reading(self) -> None:
        self._real.resume_reading()

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self._real.get_write_buffer_size()

    # --- the socket's side -----------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if data:
            self._ws.receive_data(data)
        for event in self._ws.events():
            if self._closing or self._protocol is None:
                return
            if isinstance(event, BytesMessage):
                if event.data:
                    self._protocol.data_received(bytes(event.data))
            elif isinstance(event, Ping):
                self._real.write(self._ws.send(event.response()))
            elif isinstance(event, TextMessage):
                self._close(CloseReason.UNSUPPORTED_DATA)
            elif isinstance(event, CloseConnection):
                if self._ws.state is ConnectionState.REMOTE_CLOSING:
                    self._real.write(self._ws.send(event.response()))
                    self._closing = True
                    self._real.close()
                else:  # wsproto's word for bad framing
                    self._close(CloseReason(event.code))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._protocol is not None:
            self._protocol.pause_writing()

    def resume_writing(self) -> None:
        if self._protocol is not None:
            self._protocol.resume_writing()

    def _close(self, code: CloseReason) -> None:
        if self.is_closing():
            return
        self._closing = True
        if self._ws.state is ConnectionState.OPEN:
            self._real.write(self._ws.send(CloseConnection(code=code)))
        self._real.close()
