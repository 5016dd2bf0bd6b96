"""The CONNECT proxy tunnels only its routes, refuses everything else with a status, and passes bytes unchanged.
Real sockets on loopback: an echo server behind the proxy."""

from __future__ import annotations

import asyncio

import pytest

from edgehub.testing.connect_proxy import MAX_HEAD_BYTES, ConnectProxy

pytestmark = pytest.mark.timeout(20)


async def ask(proxy: ConnectProxy, head: bytes) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(head)
    async with asyncio.timeout(5):
        status = await reader.readuntil(b"\r\n\r\n")
    return status.split(b"\r\n", 1)[0], reader, writer


async def test_a_routed_connect_is_tunnelled_to_the_real_port_both_ways(echo_port: int) -> None:
    async with ConnectProxy({("127.0.0.1", 8883): ("127.0.0.1", echo_port)}) as proxy:
        status, reader, writer = await ask(proxy, b"CONNECT 127.0.0.1:8883 HTTP/1.1\r\nHost: 127.0.0.1:8883\r\n\r\n")
        assert status == b"HTTP/1.1 200 Connection established"
        payload = bytes(range(256)) * 1000
        writer.write(payload)
        async with asyncio.timeout(5):
            assert await reader.readexactly(len(payload)) == payload
        writer.write_eof()
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # the echo server saw the end and closed: so does the tunnel
        writer.close()
        assert (proxy.tunnels, proxy.refused) == (1, 0)


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"CONNECT 127.0.0.1:1883 HTTP/1.1\r\n\r\n", b"HTTP/1.1 403 Forbidden"),
        (b"CONNECT example.com:8883 HTTP/1.1\r\n\r\n", b"HTTP/1.1 403 Forbidden"),
        (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
        (b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
        (b"CONNECT 127.0.0.1:8883 HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
    ],
)
async def test_anything_but_a_routed_connect_is_refused_with_a_status_and_closed(
    echo_port: int, head: bytes, status: bytes
) -> None:
    async with ConnectProxy({("127.0.0.1", 8883): ("127.0.0.1", echo_port)}) as proxy:
        got, reader, writer = await ask(proxy, head)
        assert got == status
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()
        assert (proxy.tunnels, proxy.refused) == (0, 1)


async def test_a_client_that_sends_no_request_head_in_time_is_closed(echo_port: int) -> None:
    async with ConnectProxy({("127.0.0.1", 8883): ("127.0.0.1", echo_port)}, head_timeout_s=0.2) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"CONNECT 127.0.0.1:8883 HTTP/1.1\r\n")  # and never the blank line
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()
        assert proxy.tunnels == 0
