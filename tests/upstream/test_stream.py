"""The upstream's way through a proxy and over a WebSocket (``edgehub.upstream.mqtt.stream.dial``) against a
scripted peer on 127.0.0.1: the test reads what ``dial`` writes (the CONNECT request byte for byte, the upgrade
and the frames through wsproto's server side) and answers with what it built, well-formed or not."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, Message, RejectConnection, Request

from edgehub.core import FailureKind, TransportError
from edgehub.upstream.mqtt.settings import ProxySettings
from edgehub.upstream.mqtt.stream import MAX_ANSWER_BYTES, dial

pytestmark = pytest.mark.timeout(30)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[int]:
    """A peer on 127.0.0.1 running ``script`` on each connection; yields its port."""
    tasks: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await script(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await server.wait_closed()


class Received(asyncio.Protocol):
    """The Connection's place: what reaches it, and its transport."""

    def __init__(self) -> None:
        self.data = asyncio.Queue[bytes]()
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.data.put_nowait(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()


async def upgrade_request(ws: WSConnection, reader: asyncio.StreamReader) -> Request:
    """The client's upgrade request, read through wsproto's server side."""
    while True:
        for event in ws.events():
            if isinstance(event, Request):
                return event
        ws.receive_data(await reader.read(4096))


def answering(answer: bytes) -> Script:
    """A proxy that reads the request head and answers ``answer``."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        await reader.read()

    return script


async def test_through_the_proxy_and_over_a_websocket_mqtt_bytes_go_both_ways() -> None:
    seen: dict[str, bytes] = {}

    async def proxy_then_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connect"] = await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        request = await upgrade_request(ws := WSConnection(ConnectionType.SERVER), reader)
        seen["target"] = request.target.encode()
        seen["subprotocols"] = ",".join(request.subprotocols).encode()
        writer.write(ws.send(AcceptConnection(subprotocol="mqtt")) + ws.send(Message(data=b"\x20\x02\x00\x00")))
        got = b""
        while not got:
            ws.receive_data(await reader.read(4096))
            got = b"".join(e.data for e in ws.events() if isinstance(e, BytesMessage))
        seen["from client"] = got
        writer.write(ws.send(Message(data=b"\xd0\x00")))
        await reader.read()

    async with scripted(proxy_then_broker) as port:
        received = Received()
        proxy = ProxySettings("127.0.0.1", port, username="edge", password="s3cret")
        transport = await dial(
            received, host="broker.example", port=443, tls=None, proxy=proxy, websocket_path="/$iothub/websocket"
        )
        async with asyncio.timeout(10):
            assert await received.data.get() == b"\x20\x02\x00\x00"  # what came with the 101
            transport.write(b"\xc0\x00")
            assert await received.data.get() == b"\xd0\x00"
        transport.close()
        async with asyncio.timeout(10):
            await received.lost.wait()
    basic = base64.b64encode(b"edge:s3cret").decode()
    assert (
        seen["connect"]
        == (
            f"CONNECT broker.example:443 HTTP/1.1\r\nHost: broker.example:443\r\nProxy-Authorization: Basic {basic}"
            "\r\n\r\n"
        ).encode()
    )
    assert seen["target"] == b"/$iothub/websocket"
    assert seen["subprotocols"] == b"mqtt"
    assert seen["from client"] == b"\xc0\x00"


@pytest.mark.parametrize(
    ("answer", "kind", "said"),
    [
        (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", FailureKind.PERMANENT, "407"),
        (b"HTTP/1.0 401 Unauthorized\r\n\r\n", FailureKind.PERMANENT, "401"),  # tinyproxy's word for it
        (b"HTTP/1.1 403 Forbidden\r\n\r\n", FailureKind.TRANSIENT, "403"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", FailureKind.TRANSIENT, "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-Pad: aaaaaaaa\r\n" * 2000, FailureKind.TRANSIENT, f"{MAX_ANSWER_BYTES} bytes"),
    ],
    ids=["407", "401", "403", "not-http", "endless-head"],
)
async def test_a_proxy_answer_that_is_no_success_is_a_transport_error_of_its_kind(
    answer: bytes, kind: FailureKind, said: str
) -> None:
    async with scripted(answering(answer)) as port, asyncio.timeout(10):
        proxy = ProxySettings("127.0.0.1", port)
        with pytest.raises(TransportError) as failed:
            await dial(Received(), host="broker.example", port=8883, tls=None, proxy=proxy, websocket_path=None)
    assert failed.value.kind is kind
    assert said in str(failed.value)


async def test_a_refused_upgrade_is_a_transport_error_naming_the_status() -> None:
    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ws = WSConnection(ConnectionType.SERVER)
        await upgrade_request(ws, reader)
        writer.write(ws.send(RejectConnection(status_code=404)))
        await reader.read()

    async with scripted(broker) as port, asyncio.timeout(10):
        with pytest.raises(TransportError) as failed:
            await dial(Received(), host="127.0.0.1", port=port, tls=None, proxy=None, websocket_path="/mqtt")
    assert failed.value.kind is FailureKind.TRANSIENT
    assert "refused with 404" in str(failed.value)
