"""The broker's side of the wire in the upstream client's tests: a scripted broker on 127.0.0.1 (the test reads
each packet the client writes, byte for byte, and writes the answers it built by hand), and small builders for
those bytes."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast


def text(s: str) -> bytes:
    """A UTF-8 string field: two length bytes, then the text."""
    raw = s.encode()
    return struct.pack("!H", len(raw)) + raw


def with_header(first: int, body: bytes) -> bytes:
    """A short packet: its first byte, a one-byte remaining length, its body."""
    assert len(body) < 128
    return bytes((first, len(body))) + body


class _Accepted(asyncio.Protocol):
    """One accepted connection: its bytes into a StreamReader, its transport kept for writing and closing."""

    def __init__(self, broker: ScriptedBroker) -> None:
        self.broker = broker
        self.reader = asyncio.StreamReader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's is no subclass)
        self.broker.transports.append(self.transport)
        self.broker.accepted.put_nowait(self)

    def data_received(self, data: bytes) -> None:
        self.reader.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.reader.feed_eof()


class ScriptedBroker:
    """Accepts connections on 127.0.0.1; the test reads each packet the client writes and writes the answers.
    Every accepted socket is recorded when it is accepted (no task in between), so every one is closed."""

    def __init__(self) -> None:
        self.accepted: asyncio.Queue[_Accepted] = asyncio.Queue()
        self.transports: list[asyncio.Transport] = []
        self.port = 0
        self.conn: _Accepted | None = None

    async def next_connection(self) -> None:
        self.conn = await self.accepted.get()

    async def read_packet(self) -> bytes:
        """One whole packet from the client, fixed header included."""
        assert self.conn is not None
        reader = self.conn.reader
        head = await reader.readexactly(1)
        size = shift = 0
        while True:
            byte = (await reader.readexactly(1))[0]
            head += bytes((byte,))
            size |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        return head + await reader.readexactly(size)

    def write(self, data: bytes) -> None:
        assert self.conn is not None
        assert self.conn.transport is not None
        self.conn.transport.write(data)

    async def closed_by_client(self) -> bool:
        assert self.conn is not None
        return await self.conn.reader.read(1) == b""


@asynccontextmanager
async def scripted() -> AsyncIterator[ScriptedBroker]:
    broker = ScriptedBroker()
    server = await asyncio.get_running_loop().create_server(lambda: _Accepted(broker), "127.0.0.1", 0)
    broker.port = server.sockets[0].getsockname()[1]
    try:
        yield broker
    finally:
        server.close()
        for transport in broker.transports:
            transport.abort()
        await server.wait_closed()  # on uvloop (and Python 3.12+), once every connection is closed
