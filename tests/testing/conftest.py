"""An echo server on 127.0.0.1 port 0, the far end the link simulator and the CONNECT proxy are tested against."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
