"""The admin API's HTTP/1.1 server: h11 (sans-IO) driven by an asyncio stream server on 127.0.0.1.

Why h11 and not aiohttp: the admin port answers a handful of local requests a minute, and the hub must fit a
Raspberry Pi Zero 2 W (an idle RSS of at most 45 MB). h11 is one pure-Python package of some 2,000 lines with no
dependencies (importing it costs well under 1 MB), the sans-IO model the house follows for its own protocols
(bytes in, events out; STYLE.md), and it leaves every bound in our hands. aiohttp brings multidict, yarl,
frozenlist, aiosignal and its C parser (several MB resident) for features the admin API does not use.

What the server does: it reads one request at a time per connection (keep-alive allowed), hands a ``Request``
to the handler and writes its ``Response``. Everything a client sends is bounded (``AdminLimits``):
* the request line and headers (``max_header_bytes``: h11's ``max_incomplete_event_size``; over it: 431);
* the body (``max_body_bytes``: a larger ``Content-Length`` is refused before any of the body is read, a
  chunked body as soon as it passes the bound; 413);
* connections at once (``max_connections``), and time: a connection must send a whole request head within
  ``header_timeout_s`` of being ready for it (a new connection: of its accept; a kept-alive one: of its last
  answer), or it is closed (a new one that asked nothing, or one with half a head, logged; an idle kept-alive one
  quietly); a request with the token then has ``request_timeout_s`` from its start to arrive whole, one without
  it ``header_timeout_s`` (it can only be a probe or a refusal: nothing it asks needs a slow body); a response
  must be written within ``request_timeout_s``.
* the token holder always gets a connection (``holds_token``: whether a request's ``Authorization`` carries the
  admin token). A connection whose request carried the token leaves the ``max_connections`` pool for its own
  (``max_token_connections``). And when the pool is full, a new connection closes the pool's connection that has
  waited longest for its request (head or body) instead of being refused: a stranger's idle sockets, re-opened as
  fast as they are closed, cannot keep the CLI out, since its request arrives the moment it connects. Only when
  every pooled connection is in its handler is a new one answered 503. (A reserved slot any connection may try
  would be held by the same stranger's sockets: the head must be read before the token is seen.)
Each refusal is one line through the shared ``RefusalLog`` (per peer, rate-limited) with its ``RefusalReason``.

Invariants:
* only loopback addresses are bound (``host`` must be one: the API gives control over the hub);
* a handler's exception is a 500 with no detail for the client and a logged traceback for us; nothing a client
  sends reaches the client as a traceback, and one client never takes the server down;
* the response to a refused request closes the connection (its unread rest is not trusted to be framed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self
from urllib.parse import parse_qsl, urlsplit

import h11

from edgehub.core.refusals import RefusalLog, RefusalReason

__all__ = ["AdminHttpServer", "AdminLimits", "Handler", "Request", "Response"]

log = logging.getLogger(__name__)

_READ_SIZE = 16_384
_LINGER_S = 1.0
_LINGER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminLimits:
    """The bounds on what an admin client may send (module docstring)."""

    max_header_bytes: int = 8_192
    max_body_bytes: int = 1 << 20  # a deployment manifest is a few KB; IoT Hub caps a twin's desired at 32 KB
    max_connections: int = 16  # the pool every new connection starts in
    max_token_connections: int = 16  # connections that sent the admin token, beside the pool
    header_timeout_s: float = 3.0
    request_timeout_s: float = 10.0
    max_query_params: int = 16

    def __post_init__(self) -> None:
        counts = (self.max_header_bytes, self.max_body_bytes, self.max_connections, self.max_token_connections)
        if min(*counts, self.max_query_params) < 1:
            raise ValueError("admin limits must be positive")
        if self.request_timeout_s <= 0 or self.header_timeout_s <= 0:
            raise ValueError("request_timeout_s and header_timeout_s must be positive")


@dataclass(frozen=True, slots=True)
class Request:
    """One whole request. ``path`` is decoded (percent-escapes undone per segment by the router, not here);
    header names are lower case."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    peer: str


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = field(default=())

    @classmethod
    def json(cls, status: int, value: object) -> Response:
        return cls(status, json.dumps(value, sort_keys=True).encode() + b"\n")

    @classmethod
    def error(cls, status: int, reason: str, detail: str) -> Response:
        """A refusal: ``{"error": reason, "detail": ...}``."""
        return cls.json(status, {"error": reason, "detail": detail})


Handler = Callable[[Request], Awaitable[Response]]


class _Refused(Exception):
    """A request refused before the handler saw it."""

    def __init__(self, status: int, reason: RefusalReason, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail


@dataclass(slots=True, eq=False)
class _Slot:
    """One served connection: whether it showed the token, and since when it waits for a request (None: its
    request is in the handler or its answer on the way)."""

    peer: str
    task: asyncio.Task[None]
    reading_since: float | None
    holder: bool = False


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AdminHttpServer:
    """``async with AdminHttpServer(handler, port=0, refusals=...) as server:`` serves until the block ends;
    ``server.port`` is the bound port."""

    def __init__(
        self,
        handler: Handler,
        *,
        refusals: RefusalLog,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: AdminLimits | None = None,
        holds_token: Callable[[str], bool] = lambda authorization: False,
    ) -> None:
        if not is_loopback(host):
            raise ValueError(f"the admin API listens on loopback only, not {host!r}")
        self._handler = handler
        self._refusals = refusals
        self._host = host
        self._port = port
        self.limits = limits or AdminLimits()
        self.port = 0
        self._holds_token = holds_token
        self._server: asyncio.Server | None = None
        self._pool: set[_Slot] = set()  # every connection, until one of its requests carried the token
        self._holders: set[_Slot] = set()  # those whose request did
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        try:
            self._server = await asyncio.start_server(self._accepted, self._host, self._port, limit=_READ_SIZE)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"the admin API cannot listen on {self._host}:{self._port} ({exc.strerror}); "
                "--admin-port 0 takes a free port",
            ) from exc
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("admin.listening host=%s port=%d", self._host, self.port)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Our own named task, not the one asyncio.start_server makes for a coroutine callback: that one logs an
        # error when it is cancelled (Python 3.11), and the server cancels its connections when it stops.
        peer = _peer(writer)
        task = asyncio.get_running_loop().create_task(self._connection(reader, writer, peer), name=f"admin {peer}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _make_room(self) -> bool:
        """Whether the pool has room for one more, once the connection that has waited longest for its request
        is closed when it is full (module docstring)."""
        if len(self._pool) < self.limits.max_connections:
            return True
        waiting = [slot for slot in self._pool if slot.reading_since is not None]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda slot: slot.reading_since or 0.0)
        self._pool.discard(oldest)
        oldest.task.cancel()
        self._refusals.refused(
            RefusalReason.TOO_MANY_CONNECTIONS,
            peer=oldest.peer,
            port=self.port,
            limit=self.limits.max_connections,
            detail="closed for a newer connection: it had waited longest for its request",
        )
        return True

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        try:
            task = asyncio.current_task()
            assert task is not None  # a coroutine run by the loop
            if not self._make_room():
                self._refusals.refused(
                    RefusalReason.TOO_MANY_CONNECTIONS, peer=peer, port=self.port, limit=self.limits.max_connections
                )
                conn = h11.Connection(h11.SERVER)
                busy = Response.error(503, "too_many_connections", "the admin API serves few clients at once")
                with contextlib.suppress(OSError, TimeoutError, h11.LocalProtocolError):
                    async with asyncio.timeout(self.limits.request_timeout_s):
                        await _write(writer, conn, busy, close=True)
                await _linger(reader, writer)
                return
            slot = _Slot(peer, task, asyncio.get_running_loop().time())
            self._pool.add(slot)
            try:
                await self._serve(reader, writer, slot)
            finally:
                self._pool.discard(slot)
                self._holders.discard(slot)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("admin.connection_failed peer=%s", peer)  # a bug: one client never takes the server down
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: _Slot) -> None:
        limits = self.limits
        peer = slot.peer
        loop = asyncio.get_running_loop()
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        served = 0
        while True:
            started: list[bool] = [False]  # whether any byte of this request came (h11's state moves at its head)
            slot.reading_since = begun = loop.time()
            try:
                async with asyncio.timeout(limits.header_timeout_s) as deadline:
                    on_head = functools.partial(self._on_head, slot, deadline, begun + limits.request_timeout_s)
                    request = await self._read_request(conn, reader, peer, started, on_head)
            except TimeoutError:
                if conn.their_state is h11.IDLE:  # no whole head
                    if not started[0] and served:
                        return  # an idle keep-alive connection: closed quietly, it was answered and asks nothing
                    self._refusals.refused(
                        RefusalReason.REQUEST_TIMEOUT, peer=peer, timeout_s=limits.header_timeout_s, phase="head"
                    )
                    if not started[0]:
                        return  # it asked nothing: nothing to answer
                else:
                    # The deadline it had: the holder's request_timeout_s, or a stranger's header_timeout_s.
                    timeout_s = round((deadline.when() or begun) - begun, 3)
                    self._refusals.refused(RefusalReason.REQUEST_TIMEOUT, peer=peer, timeout_s=timeout_s)
                await self._refuse(writer, conn, _Refused(408, RefusalReason.REQUEST_TIMEOUT, "request too slow"))
                return
            except _Refused as refusal:
                self._refusals.refused(refusal.reason, peer=peer, detail=refusal.detail)
                await self._refuse(writer, conn, refusal)
                await _linger(reader, writer)
                return
            if request is None:
                return
            slot.reading_since = None  # in the handler: not to be closed for a newer connection
            served += 1
            try:
                response = await self._handler(request)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("admin.handler_failed peer=%s method=%s path=%s", peer, request.method, request.path)
                response = Response.error(500, "internal_error", "the hub failed to answer; see its log")
            try:
                async with asyncio.timeout(limits.request_timeout_s):
                    await _write(writer, conn, response, close=False, head=request.method == "HEAD")
            except (OSError, TimeoutError):
                return
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return  # the client's side is not done (it sent more than it framed): close

    def _on_head(self, slot: _Slot, deadline: asyncio.Timeout, holder_deadline: float, head: h11.Request) -> None:
        """The token holder's request may take ``request_timeout_s`` from its start; a stranger's gets no longer
        than its head did."""
        if self._holder(slot, head):
            deadline.reschedule(holder_deadline)

    def _holder(self, slot: _Slot, head: h11.Request) -> bool:
        """Whether ``head`` carries the token; its connection then leaves the pool (while the holders' own has
        room: past that it stays a pooled connection)."""
        if not slot.holder:
            authorization = _header(head.headers, b"authorization")
            if authorization is None or not self._holds_token(authorization):
                return False
            if len(self._holders) >= self.limits.max_token_connections:
                return True
            slot.holder = True
            self._pool.discard(slot)
            self._holders.add(slot)
        return True

    async def _read_request(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        peer: str,
        started: list[bool],
        on_head: Callable[[h11.Request], None],
    ) -> Request | None:
        """The next whole request; None when the client closed between requests. Raises ``_Refused``.
        ``on_head`` is told of the request's head as soon as it is in."""
        head: h11.Request | None = None
        body = bytearray()
        max_body = self.limits.max_body_bytes
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                if exc.error_status_hint == 431:
                    raise _Refused(431, RefusalReason.REQUEST_TOO_LARGE, "request line and headers too large") from exc
                raise _Refused(400, RefusalReason.MALFORMED_REQUEST, str(exc)) from exc
            if event is h11.NEED_DATA:
                data = await reader.read(_READ_SIZE)
                if not data and conn.their_state is h11.IDLE and not started[0]:
                    return None
                started[0] = started[0] or bool(data)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                if head is None:
                    return None
                raise _Refused(400, RefusalReason.MALFORMED_REQUEST, "connection closed inside a request")
            if isinstance(event, h11.Request):
                head = event
                # h11 bounds only a head that has not arrived whole; one that arrived in one read is measured here.
                size = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
                if size > self.limits.max_header_bytes:
                    raise _Refused(431, RefusalReason.REQUEST_TOO_LARGE, "request line and headers too large")
                length = _header(event.headers, b"content-length")
                if length is not None and length.isdigit() and int(length) > max_body:
                    raise _Refused(413, RefusalReason.REQUEST_TOO_LARGE, f"body over {max_body} bytes")
                on_head(event)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > max_body:
                    raise _Refused(413, RefusalReason.REQUEST_TOO_LARGE, f"body over {max_body} bytes")
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None  # h11 orders Request before EndOfMessage
                return self._request(head, bytes(body), peer)

    def _request(self, head: h11.Request, body: bytes, peer: str) -> Request:
        try:
            target = head.target.decode("ascii")
            split = urlsplit(target)
            pairs = parse_qsl(split.query, keep_blank_values=True, max_num_fields=self.limits.max_query_params)
            headers = {name.decode("ascii").lower(): value.decode("latin-1") for name, value in head.headers}
        except (UnicodeDecodeError, ValueError) as exc:
            raise _Refused(400, RefusalReason.MALFORMED_REQUEST, f"bad request target or headers: {exc}") from exc
        # The path stays percent-encoded here: a segment may hold an escaped "/" (the router splits, then unquotes).
        return Request(head.method.decode("ascii"), split.path, dict(pairs), headers, body, peer)

    async def _refuse(self, writer: asyncio.StreamWriter, conn: h11.Connection, refusal: _Refused) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        response = Response.error(refusal.status, refusal.reason.value, refusal.detail)
        with contextlib.suppress(OSError, TimeoutError, h11.LocalProtocolError):
            async with asyncio.timeout(self.limits.request_timeout_s):
                await _write(writer, conn, response, close=True)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Close after a refusal without resetting: end our side, then read and drop what the client still sends
    (at most 64 KiB, for at most a second), so the refusal is read before the socket goes (closing with unread
    input sends a reset, which may destroy the answer in flight)."""
    with contextlib.suppress(OSError, TimeoutError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(_LINGER_S):
            left = _LINGER_BYTES
            while left > 0:
                data = await reader.read(min(left, _READ_SIZE))
                if not data:
                    return
                left -= len(data)


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _peer(writer: asyncio.StreamWriter) -> str:
    """The client's address without its port: refusals are rate-limited per peer, and a client that opens a new
    connection (a new source port) for every try must still share one budget of log lines."""
    info = writer.get_extra_info("peername")
    if isinstance(info, tuple) and len(info) >= 2:
        return str(info[0])
    return str(info)


async def _write(
    writer: asyncio.StreamWriter, conn: h11.Connection, response: Response, *, close: bool, head: bool = False
) -> None:
    """Send ``response``; the answer to a HEAD request has its headers (its length too) and no body."""
    headers = [
        ("content-type", response.content_type),
        ("content-length", str(len(response.body))),
        *response.headers,
    ]
    if close:
        headers.append(("connection", "close"))
    data = conn.send(h11.Response(status_code=response.status, headers=headers))
    writer.write(data or b"")
    if response.body and not head:
        writer.write(conn.send(h11.Data(data=response.body)) or b"")
    writer.write(conn.send(h11.EndOfMessage()) or b"")
    await writer.drain()
