"""MQTT over WebSockets on the WebSocket listener (``protocol_heads.websocket``), with paho's own WebSocket
transport, and the listener's bounds against hostile upgrades and frames, with requests and frames written byte
by byte on a raw socket (the upgrade request by wsproto's client side, a foreign implementation)."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import socket
import ssl
import struct
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request
from wsproto.events import Message as WsMessage

from edgehub.core import Identity
from edgehub.core.refusals import RefusalLog
from edgehub.hub import ConnectionLimiter, Ticket
from edgehub.mqtt.client import connect_packet
from edgehub.testing import InMemoryHub
from edgehub.testing.certs import TestCA
from protocol_heads.mqtt.client_socket import ClientSocket
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from protocol_heads.websocket import IOTHUB_PATH, SUBPROTOCOL_MQTT, WebSocketServer, WebSocketSettings
from protocol_heads.websocket_stream import UpgradeSocket, WebSocketStream
from tests.protocol_heads.amqp.conftest import polled
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, Paho, sas_password, server_context, username

pytestmark = pytest.mark.timeout(60)

LOG = "protocol_heads.websocket"


@dataclass
class Listeners:
    mqtt: MqttServer
    ws: WebSocketServer


async def listen(hub: InMemoryHub, ca: TestCA, **ws_settings: object) -> AsyncIterator[Listeners]:
    context = server_context(ca)
    mqtt_settings = MqttSettings(tcp_port=None, tls_port=None, connect_timeout_s=2.0)
    async with MqttServer(hub, settings=mqtt_settings) as mqtt:
        settings = WebSocketSettings(tcp_port=0, tls_port=0, ssl_context=context, **ws_settings)  # type: ignore[arg-type]
        async with WebSocketServer(hub, settings=settings, heads={SUBPROTOCOL_MQTT: mqtt}) as ws:
            yield Listeners(mqtt, ws)


@pytest.fixture
async def listeners(hub: InMemoryHub, ca: TestCA) -> AsyncIterator[Listeners]:
    async for pair in listen(hub, ca, connect_timeout_s=2.0, max_message_frames=16, max_frame_bytes=512 * 1024):
        yield pair


# --- a raw WebSocket client -----------------------------------------------------------------------------------


def upgrade_request(path: str = IOTHUB_PATH, subprotocols: tuple[str, ...] = (SUBPROTOCOL_MQTT,)) -> bytes:
    return WSConnection(ConnectionType.CLIENT).send(
        Request(host="localhost", target=path, subprotocols=list(subprotocols))
    )


def frame(opcode: int, payload: bytes, *, fin: bool = True, length: int | None = None) -> bytes:
    """A client frame (masked, as a client's must be); ``length``: the length announced, if not the payload's."""
    n = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = b"\x01\x02\x03\x04"
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


BINARY, TEXT, CONTINUATION = 0x2, 0x1, 0x0


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, ca: TestCA | None = None) -> RawClient:
        context = None
        if ca is not None:
            context = ssl.create_default_context(cafile=str(ca.ca_pem))
            context.check_hostname = False
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self) -> tuple[int, bytes]:
        """The HTTP status line's code and the whole head."""
        async with asyncio.timeout(10):
            head = await self.reader.readuntil(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), head

    async def close_code(self) -> int:
        """The close frame the server sends (skipping anything before it), then the end of the stream."""
        async with asyncio.timeout(10):
            while True:
                first, second = await self.reader.readexactly(2)
                n = second & 0x7F
                if n == 126:
                    (n,) = struct.unpack("!H", await self.reader.readexactly(2))
                elif n == 127:
                    (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
                payload = await self.reader.readexactly(n)
                if first & 0x0F == 0x8:
                    code: int = struct.unpack("!H", payload[:2])[0]
                    try:  # and the server closed the socket (reset: it left some of what we sent unread)
                        assert await self.reader.read() == b""
                    except ConnectionResetError:
                        pass
                    return code

    async def ended(self) -> bytes:
        async with asyncio.timeout(10):
            return await self.reader.read()

    def close(self) -> None:
        self.writer.close()


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG and r.getMessage().startswith("refused ")]


# --- a real client --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("secure", [True, False], ids=["wss", "ws"])
async def test_paho_over_a_websocket_logs_in_publishes_and_subscribes(
    listeners: Listeners, hub: InMemoryHub, ca: TestCA, secure: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    paho = Paho.make("dev1", websocket_path=IOTHUB_PATH)
    port = listeners.ws.ports["wss" if secure else "ws"]
    try:
        rc = await paho.connect(
            port, tls_ca=ca.ca_pem if secure else None, user=username(DEV), password=sas_password(DEV, DEVICE_KEY)
        )
        assert rc == 0
        assert listeners.mqtt.connected == ["dev1"]  # the MQTT head's session, as over TCP
        paho.client.subscribe("devices/dev1/messages/devicebound/#", qos=1)
        async with asyncio.timeout(10):
            assert await paho.subscribes.get() == [1]
        mid = paho.publish("devices/dev1/messages/events/", b"x" * 100_000)  # several reads, one message
        async with asyncio.timeout(10):
            assert await paho.publishes.get() == (mid, 0)
    finally:
        await paho.close()
    [(identity, message)] = hub.stored
    assert identity == Identity.parse("dev1")
    assert message.body == b"x" * 100_000
    await polled(lambda: listeners.ws.limiter.total == 0)
    # paho hangs up after DISCONNECT without a close frame: an ordinary end, no refusal anywhere
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")] == []


async def test_the_head_times_a_websocket_login_as_its_own(
    listeners: Listeners, caplog: pytest.LogCaptureFixture
) -> None:
    """Upgraded but silent: the MQTT head's own login timeout closes it (the connection is the head's now)."""
    caplog.set_level(logging.INFO)
    client = await RawClient.open(listeners.ws.ports["ws"])
    try:
        await client.send(upgrade_request())
        status, head = await client.response()
        assert status == 101
        assert b"sec-websocket-protocol: mqtt" in head.lower()
        assert await client.ended() == b""
    finally:
        client.close()
    assert any("reason=connect_timeout" in r.getMessage() for r in caplog.records if r.name.endswith("mqtt.server"))


# --- refused upgrades -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason"),
    [
        (upgrade_request(path="/mqtt"), 404, "reason=not_found"),
        (upgrade_request(subprotocols=("AMQPWSB10",)), 400, "reason=invalid_request"),
        (upgrade_request(subprotocols=()), 400, "reason=invalid_request"),
        (b"GET /$iothub/websocket HTTP/1.1\r\nHost: x\r\n\r\n", 400, "reason=malformed_request"),
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "reason=malformed_request"),
        (upgrade_request().replace(b"\r\n\r\n", b"\r\nx-pad: " + b"a" * 9000 + b"\r\n\r\n"), 431, "request_too_large"),
    ],
    ids=["wrong-path", "subprotocol-not-served", "no-subprotocol", "no-upgrade", "not-http", "oversize"],
)
async def test_a_bad_upgrade_is_refused_with_an_http_status_and_one_line(
    listeners: Listeners, ca: TestCA, caplog: pytest.LogCaptureFixture, request_bytes: bytes, status: int, reason: str
) -> None:
    caplog.set_level(logging.INFO, LOG)
    client = await RawClient.open(listeners.ws.ports["wss"], ca)
    try:
        await client.send(request_bytes)
        assert (await client.response())[0] == status
        assert await client.ended() == b""
    finally:
        client.close()
    [line] = refusal_lines(caplog)
    assert reason in line
    assert "peer=127.0.0.1" in line
    assert f"status={status}" in line
    assert listeners.mqtt.connected == []


def send_all_then_read(port: int, data: bytes) -> bytes:
    """Send all of ``data`` whatever the server answers meanwhile, then read to EOF (a blocking socket, in a
    thread): a server that closed with bytes unread would reset, and this would raise."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


async def test_a_client_sending_all_of_an_oversize_request_reads_the_431(listeners: Listeners) -> None:
    # Refused after 8 KiB; the rest is dropped as it comes until the client hangs up, so it reads why.
    request = upgrade_request().replace(b"\r\n\r\n", b"\r\nx-pad: " + b"a" * (4 << 20) + b"\r\n\r\n")
    answer = await asyncio.to_thread(send_all_then_read, listeners.ws.ports["ws"], request)
    assert answer.startswith(b"HTTP/1.1 431 ")


async def test_a_slow_upgrade_request_gets_408_at_the_connect_timeout(
    listeners: Listeners, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOG)
    client = await RawClient.open(listeners.ws.ports["ws"])
    try:
        await client.send(upgrade_request()[:30])  # and the rest never comes
        assert (await client.response())[0] == 408
    finally:
        client.close()
    [line] = refusal_lines(caplog)
    assert "reason=connect_timeout" in line


# --- refused frames -------------------------------------------------------------------------------------------


async def upgraded(port: int) -> RawClient:
    client = await RawClient.open(port)
    await client.send(upgrade_request())
    assert (await client.response())[0] == 101
    return client


async def logs_in(client: RawClient) -> None:
    """dev1 logs in (MQTT 3.1.1, SAS) over the upgraded ``client``: its CONNECT in one binary frame, the CONNACK
    back in one."""
    connect = connect_packet(
        v5=False,
        client_id="dev1",
        keepalive_s=60,
        clean=True,
        username=username(DEV),
        password=sas_password(DEV, DEVICE_KEY),
    )
    await client.send(frame(BINARY, connect))
    async with asyncio.timeout(10):
        assert await client.reader.readexactly(6) == b"\x82\x04\x20\x02\x00\x00"  # CONNACK, accepted


@pytest.mark.parametrize(
    ("frames", "code", "reason"),
    [
        # a message that never ends: empty fragments, each one counted
        (frame(BINARY, b"", fin=False) + frame(CONTINUATION, b"", fin=False) * 40, 1009, "reason=too_large"),
        (frame(TEXT, b"hello"), 1003, "reason=malformed_packet"),
        (b"\x82\x05hello", 1002, "reason=malformed_packet"),  # not masked
    ],
    ids=["endless-fragments", "text", "unmasked"],
)
async def test_a_bad_frame_closes_the_websocket_with_its_code_and_one_line(
    listeners: Listeners, caplog: pytest.LogCaptureFixture, frames: bytes, code: int, reason: str
) -> None:
    caplog.set_level(logging.INFO, LOG)
    client = await upgraded(listeners.ws.ports["ws"])
    try:
        try:
            await client.send(frames)
        except ConnectionError:
            pass  # closed while we still wrote: the close frame is what counts
        assert await client.close_code() == code
    finally:
        client.close()
    [line] = refusal_lines(caplog)
    assert reason in line
    assert f"close_code={code}" in line


async def test_a_frame_over_its_bound_closes_with_1009_however_long_it_says_it_is(
    hub: InMemoryHub, ca: TestCA, caplog: pytest.LogCaptureFixture
) -> None:
    """A logged-in client's frame announcing 1 TiB, carrying the start of a 200 KB PUBLISH (which the MQTT head
    takes, 257 KiB being its bound): its bytes go on to the head as they come, and the frame is refused once it
    passes ``max_frame_bytes`` (64 KiB here), never buffered whole."""
    caplog.set_level(logging.INFO, LOG)
    async for pair in listen(hub, ca, max_frame_bytes=64 * 1024):
        client = await upgraded(pair.ws.ports["ws"])
        try:
            await logs_in(client)
            topic = b"devices/dev1/messages/events/"
            body = 200_000 - len(topic) - 2
            remaining = 2 + len(topic) + body
            varint = bytes([(remaining & 0x7F) | 0x80, ((remaining >> 7) & 0x7F) | 0x80, remaining >> 14])
            publish_start = b"\x30" + varint + struct.pack("!H", len(topic)) + topic + b"x" * 100_000
            await client.send(frame(BINARY, publish_start, length=1 << 40))
            assert await client.close_code() == 1009
        finally:
            client.close()
    [line] = refusal_lines(caplog)
    assert "reason=packet_too_large" in line
    assert "client=dev1" in line  # the head's client, logged in before the frame
    assert "close_code=1009" in line
    assert hub.stored == []


async def test_a_ping_gets_its_pong_and_reading_goes_on(listeners: Listeners) -> None:
    client = await upgraded(listeners.ws.ports["ws"])
    try:
        await client.send(frame(0x9, b"are you there"))
        async with asyncio.timeout(10):
            first, n = await client.reader.readexactly(2)
            assert (first & 0x0F, n) == (0xA, 13)
            assert await client.reader.readexactly(13) == b"are you there"
    finally:
        client.close()


async def test_the_listener_counts_upgrades_under_its_own_pre_login_cap(
    hub: InMemoryHub, ca: TestCA, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOG)
    async for pair in listen(hub, ca, max_pending_per_address=2):
        port = pair.ws.ports["ws"]
        held = [await RawClient.open(port) for _ in range(2)]
        try:
            # the third from the address is closed at accept, before any byte of its request is read
            third = await RawClient.open(port)
            assert await third.ended() == b""
            third.close()
        finally:
            for client in held:
                client.close()
    assert any("reason=too_many_connections" in line for line in refusal_lines(caplog))


async def test_a_websocket_is_counted_by_the_listener_then_the_head_and_given_back_by_both_when_it_ends(
    listeners: Listeners, ca: TestCA
) -> None:
    ws, mqtt = listeners.ws.limiter, listeners.mqtt.limiter
    paho = Paho.make("dev1", websocket_path=IOTHUB_PATH)
    try:
        rc = await paho.connect(
            listeners.ws.ports["wss"], tls_ca=ca.ca_pem, user=username(DEV), password=sas_password(DEV, DEVICE_KEY)
        )
        assert rc == 0
        # one connection: under the listener's total cap (its socket), the head's total, pending at neither
        assert (ws.total, ws.pending, mqtt.total, mqtt.pending) == (1, 0, 1, 0)
    finally:
        await paho.close()
    await polled(lambda: ws.total == mqtt.total == 0)  # given back as the socket closes
    assert (ws.closed, mqtt.closed) == (1, 1)


async def test_a_client_certificate_over_wss_logs_in_as_its_identity(
    listeners: Listeners, hub: InMemoryHub, ca: TestCA
) -> None:
    """The TLS is the listener's, the login the MQTT head's: the head reads the certificate through the
    WebSocket's transport as it would through its own socket's (X.509 over WebSockets, as IoT Hub takes it)."""
    pair = ca.client("certdev")
    der = x509.load_pem_x509_certificate(pair.cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    hub.add_identity(Identity.parse("certdev"), thumbprint=hashlib.sha256(der).hexdigest())
    dev = Paho.make("certdev", websocket_path=IOTHUB_PATH)
    dev.client.tls_set(ca_certs=str(ca.ca_pem), certfile=str(pair.cert), keyfile=str(pair.key))
    try:
        assert await dev.connect(listeners.ws.ports["wss"], user="edgehub.local/certdev/?api-version=2021-04-12") == 0
        mid = dev.publish("devices/certdev/messages/events/", b"x")
        async with asyncio.timeout(10):
            assert await dev.publishes.get() == (mid, 0)
    finally:
        await dev.close()
    assert hub.stored[0][1].system_properties["connectionAuthMethod"] == "x509"


async def test_a_client_that_hangs_up_without_a_close_frame_is_no_refusal(
    listeners: Listeners, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOG)
    client = await upgraded(listeners.ws.ports["ws"])
    await client.send(frame(BINARY, b"\x10"))  # the first byte of a CONNECT, then the TCP connection ends
    client.close()
    await polled(lambda: listeners.ws.limiter.total == listeners.mqtt.limiter.total == 0)
    assert refusal_lines(caplog) == []


# --- the stream's contract with the head, on a real socket ----------------------------------------------------


class Head(asyncio.Protocol):
    """A head's socket side as the stream sees it: it records reads, pauses reading at the first one, and records
    the stream's pause_writing."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.first_read = asyncio.Event()
        self.writing_paused = asyncio.Event()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reads.append(data)
        if not self.first_read.is_set():
            assert self.transport is not None
            self.transport.pause_reading()
            self.first_read.set()

    def pause_writing(self) -> None:
        self.writing_paused.set()


async def test_the_stream_hands_nothing_on_while_the_head_pauses_and_tells_it_when_writes_back_up() -> None:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

    class Placeholder(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.set_result(transport)  # type: ignore[arg-type]

    server = await loop.create_server(Placeholder, "127.0.0.1", 0)
    _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        real = await accepted
        # An open WebSocket on both sides, its handshake done in memory (wsproto's client and server).
        client, ws = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
        ws.receive_data(client.send(Request(host="localhost", target=IOTHUB_PATH, subprotocols=["mqtt"])))
        [request] = list(ws.events())
        assert isinstance(request, Request)
        client.receive_data(ws.send(AcceptConnection(subprotocol="mqtt")))
        ticket = ConnectionLimiter(max_connections=4, max_pending=2, max_pending_per_address=2).admit("127.0.0.1")
        assert isinstance(ticket, Ticket)
        stream = WebSocketStream(
            real,
            ws,
            settings=WebSocketSettings(),
            refusals=RefusalLog(logging.getLogger(LOG)),
            address="127.0.0.1",
            ticket=ticket,
            subprotocol="mqtt",
        )
        real.set_protocol(stream)
        head = Head()
        head.connection_made(stream)
        stream.set_protocol(head)
        stream.start()

        # three messages in one write: the head pauses at the first, and the rest waits for it in the stream
        writer.write(b"".join(client.send(WsMessage(data=part)) for part in (b"a", b"b", b"c")))
        async with asyncio.timeout(10):
            await head.first_read.wait()
        assert head.reads == [b"a"]
        assert not stream.is_reading()
        stream.resume_reading()
        async with asyncio.timeout(10):
            while head.reads != [b"a", b"b", b"c"]:  # noqa: ASYNC110 (handed on at the next turns of the loop)
                await asyncio.sleep(0)

        # the other way: the socket's write buffer backs up (the client does not read), and the head is told
        stream.set_write_buffer_limits(high=1)
        stream.write(b"x" * 16 * 1024 * 1024)
        assert head.writing_paused.is_set()
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


def live(kind: type) -> list[Any]:
    return [o for o in gc.get_objects() if type(o) is kind]


async def _session_then_freed(pair: Listeners, ending: str) -> None:
    before = {id(o) for kind in (UpgradeSocket, WebSocketStream, ClientSocket) for o in live(kind)}

    def new(kind: type) -> list[Any]:
        return [o for o in live(kind) if id(o) not in before]

    client = await RawClient.open(pair.ws.ports["ws"])
    await polled(lambda: len(new(UpgradeSocket)) == 1)  # accepted: the listener's side, until the upgrade
    refs = [weakref.ref(o) for o in new(UpgradeSocket)]
    await client.send(upgrade_request())
    assert (await client.response())[0] == 101
    await logs_in(client)
    refs += [weakref.ref(o) for kind in (WebSocketStream, ClientSocket) for o in new(kind)]
    refs += [weakref.ref(o._ws) for o in new(WebSocketStream)]  # the wsproto connection
    assert len(refs) == 4
    if ending == "disconnect":
        await client.send(frame(BINARY, b"\xe0\x00"))  # MQTT DISCONNECT
        assert await client.close_code() == 1000
    elif ending == "refused-frame":
        await client.send(frame(BINARY, b"", fin=False) + frame(CONTINUATION, b"", fin=False) * 8)
        assert await client.close_code() == 1009
    client.close()
    await polled(lambda: pair.ws.limiter.total == pair.mqtt.limiter.total == 0 and not pair.mqtt._tasks)
    await polled(lambda: sum(ref() is not None for ref in refs) == 0)


@pytest.mark.parametrize("ending", ["disconnect", "refused-frame", "hang-up"])
async def test_a_closed_websocket_is_freed_without_the_cycle_collector(
    hub: InMemoryHub, ca: TestCA, no_cycle_collector: None, ending: str
) -> None:
    """As the heads' own connections (``edgehub run`` collects cycles rarely): the listener's and the head's sides
    of a WebSocket connection, and its wsproto connection, go by reference counting alone once it has closed."""
    async for pair in listen(hub, ca, max_message_frames=4):
        await _session_then_freed(pair, ending)
    assert gc.isenabled() is False
