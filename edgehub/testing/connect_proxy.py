"""An HTTP CONNECT proxy (RFC 9110, 9.3.6) on 127.0.0.1 that tunnels a client's fixed port to a server's free one.

Some clients dial a port they have no setting for: the Azure IoT device SDK for Python always dials 8883 (MQTT
over TLS) or 443 (WebSockets). Through this proxy, which the SDK supports as its users behind a corporate proxy
use it (``ProxyOptions("HTTP", address, port)``), such a client asks for ``CONNECT 127.0.0.1:8883`` and is
tunnelled to wherever the server under test really listens, so that server can take a free port and a hub the
user left running on 8883 breaks nothing.

Invariants: only the targets in ``routes`` are tunnelled (any other gets ``403``, a malformed request ``400``,
both closing the connection); the request head is bounded (``MAX_HEAD_BYTES``) and must arrive within
``head_timeout_s``; after ``200`` the bytes go through unchanged and in order both ways, and either side
closing closes the other. ``tunnels`` counts the tunnels opened, ``refused`` the requests refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Self

__all__ = ["MAX_HEAD_BYTES", "ConnectProxy"]

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8192
_CHUNK = 65536


class ConnectProxy:
    """``async with ConnectProxy({("127.0.0.1", 8883): ("127.0.0.1", port)}) as proxy:`` listens on
    ``proxy.port`` (127.0.0.1, a free port) until the block ends. ``routes`` may be filled in later (a server's
    port is often known only once it listens): a tunnel takes the routes as they are when it is asked for."""

    def __init__(self, routes: Mapping[tuple[str, int], tuple[str, int]], *, head_timeout_s: float = 10.0) -> None:
        self.routes = dict(routes)
        self.head_timeout_s = head_timeout_s
        self.tunnels = 0
        self.refused = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not listening")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=MAX_HEAD_BYTES)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._tunnel(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # a client that went away or said nothing in time: its connection is closed below
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(self.head_timeout_s):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                return await self._refuse(writer, 400, "request head too large")
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        authority = rest.partition(" ")[0]
        host, _, port = authority.rpartition(":")
        if method != "CONNECT" or not host or not port.isdigit():
            return await self._refuse(writer, 400, f"not a CONNECT request: {method!r} {authority!r}")
        target = self.routes.get((host.strip("[]"), int(port)))
        if target is None:
            return await self._refuse(writer, 403, f"no route to {authority}")
        up_reader, up_writer = await asyncio.open_connection(*target)
        self.tunnels += 1
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_pipe(reader, up_writer), name="connect-proxy-up")
                tg.create_task(_pipe(up_reader, writer), name="connect-proxy-down")
        finally:
            up_writer.close()

    async def _refuse(self, writer: asyncio.StreamWriter, status: int, reason: str) -> None:
        self.refused += 1
        log.info("connect_proxy.refused status=%d reason=%s", status, reason)
        phrase = {400: "Bad Request", 403: "Forbidden"}[status]
        writer.write(f"HTTP/1.1 {status} {phrase}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until ``reader`` ends, then end ``writer``'s direction; a reset on either side ends it too."""
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except ConnectionError:
        writer.close()
