"""Fixtures for the AMQP head: an in-memory hub, a test CA, the head on 127.0.0.1 port 0 (plain and TLS), and
proton's own blocking client run in a thread (``ProtonClient``), so the test's event loop keeps serving."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Connection, SSLDomain, Timeout, Transport
from proton import Message as AmqpMessage
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

from edgehub.core import Identity
from edgehub.core.sas import generate_sas_token, resource_uri
from edgehub.testing import InMemoryHub
from edgehub.testing.certs import TestCA
from protocol_heads.amqp import AmqpServer, AmqpSettings

HOST = "edgehub.local"
DEVICE_KEY = base64.b64encode(b"device key for dev1, 32 bytes!!").decode()
MODULE_KEY = base64.b64encode(b"module key for dev1/filter.....").decode()
DEV = Identity.parse("dev1")
MOD = Identity.parse("dev1/filter")
TIMEOUT_S = 10.0


def sas_token(identity: Identity, key: str, *, expiry_s: int = 4_000_000_000) -> str:
    return generate_sas_token(resource_uri(HOST, identity), key, expiry_s)


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "certs")


@pytest.fixture
def hub() -> InMemoryHub:
    h = InMemoryHub(host_name=HOST)
    h.add_identity(DEV, key_b64=DEVICE_KEY)
    h.add_identity(MOD, key_b64=MODULE_KEY)
    h.add_identity(Identity.parse("plain"), password=b"secret")
    return h


def server_context(ca: TestCA) -> ssl.SSLContext:
    pair = ca.server()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pair.cert, pair.key)
    ctx.load_verify_locations(ca.ca_pem)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


@pytest.fixture
async def head(hub: InMemoryHub, ca: TestCA) -> AsyncIterator[AmqpServer]:
    settings = AmqpSettings(tcp_port=0, tls_port=0, ssl_context=server_context(ca), connect_timeout_s=5.0)
    async with AmqpServer(hub, settings=settings) as server:
        yield server


class ProtonClient:
    """proton's BlockingConnection, each call run in a thread with a timeout (its own calls block)."""

    def __init__(self, conn: BlockingConnection) -> None:
        self.conn = conn

    @classmethod
    async def connect(
        cls,
        port: int,
        *,
        ca: Path | None = None,
        user: str | None = None,
        password: str | None = None,
        mechs: str | None = "PLAIN",
        cert: tuple[Path, Path] | None = None,
    ) -> ProtonClient:
        """``mechs`` None: no SASL layer at all (the plain AMQP header), as the Azure SDKs open; a CBS token logs
        the client in."""
        domain = None
        scheme = "amqp"
        if ca is not None:
            scheme = "amqps"
            domain = SSLDomain(SSLDomain.MODE_CLIENT)
            domain.set_trusted_ca_db(str(ca))
            domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
            if cert is not None:
                domain.set_credentials(str(cert[0]), str(cert[1]), None)

        def dial() -> BlockingConnection:
            return BlockingConnection(
                f"{scheme}://127.0.0.1:{port}",
                timeout=TIMEOUT_S,
                ssl_domain=domain,
                sasl_enabled=mechs is not None,
                allowed_mechs=mechs,
                user=user,
                password=password,
                allow_insecure_mechs=True,
            )

        return cls(await asyncio.to_thread(dial))

    async def sender(self, address: str, name: str | None = None) -> BlockingSender:
        return await asyncio.to_thread(self.conn.create_sender, address, None, name)

    async def receiver(self, address: str, credit: int = 10) -> BlockingReceiver:
        return await asyncio.to_thread(self.conn.create_receiver, address, credit)

    async def send(self, sender: BlockingSender, message: AmqpMessage) -> Any:
        """Send unsettled and wait for the hub's outcome (raises ``SendException`` unless accepted)."""
        return await asyncio.to_thread(sender.send, message, TIMEOUT_S)

    async def pump_until(self, condition: Callable[[], bool]) -> None:
        """Let proton's client do its I/O (it sends a settlement only then) until ``condition`` holds. In short
        turns: proton's wait looks at the condition only when an I/O event or its timeout ends a turn."""

        def turns() -> None:
            deadline = time.monotonic() + TIMEOUT_S
            while not condition():
                if time.monotonic() > deadline:
                    raise TimeoutError("the hub did not get there in time")
                with contextlib.suppress(Timeout):
                    self.conn.wait(condition, 0.05)

        await asyncio.to_thread(turns)

    async def close(self) -> None:
        await asyncio.to_thread(self.conn.close)


async def receive(receiver: BlockingReceiver) -> AmqpMessage:
    return await asyncio.to_thread(receiver.receive, TIMEOUT_S)


async def accept(receiver: BlockingReceiver) -> None:
    await asyncio.to_thread(receiver.accept)


async def put_token(client: ProtonClient, audience: str, token: str) -> AmqpMessage:
    """A CBS put-token as the Azure SDKs send it; the hub's answer."""
    cbs_out = await client.sender("$cbs")
    cbs_in = await client.receiver("$cbs")
    request = AmqpMessage(body=token, id="req-1", reply_to="cbs")
    request.properties = {"operation": "put-token", "type": "azure-devices.net:sastoken", "name": audience}
    await client.send(cbs_out, request)
    return await receive(cbs_in)


class EngineClient:
    """A client on proton's engine over an asyncio socket, driven by the test: it reads only when told to, so a
    test can tell what the hub had sent by a point (frames on one connection arrive in order)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        user: str | None,
        password: str | None,
        *,
        mechs: str | None = "PLAIN",
    ) -> None:
        self.reader, self.writer = reader, writer
        self.transport = Transport(Transport.CLIENT)
        self.connection = Connection()
        if user is not None:
            self.connection.user, self.connection.password = user, password
        if mechs is not None:  # None: no SASL layer, the plain AMQP header
            sasl = self.transport.sasl()
            sasl.allowed_mechs(mechs)
            sasl.allow_insecure_mechs = True
        self.connection.open()
        self.transport.bind(self.connection)
        self.session = self.connection.session()
        self.session.open()

    @classmethod
    async def connect(
        cls, port: int, user: str | None, password: str | None, *, mechs: str | None = "PLAIN"
    ) -> EngineClient:
        """``user`` None with ``mechs="ANONYMOUS"`` or None (no SASL layer): a client that has not logged in (a
        ``$cbs`` token would)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, user, password, mechs=mechs)

    async def pump_until(self, condition: Callable[[], bool]) -> None:
        """Write what proton has to say, then read until ``condition`` holds."""
        async with asyncio.timeout(TIMEOUT_S):
            while True:
                # proton hands out its output a buffer at a time: all of it goes before the next read
                while (pending := self.transport.pending()) > 0:
                    self.writer.write(bytes(self.transport.peek(pending)))
                    self.transport.pop(pending)
                    await self.writer.drain()
                if condition():
                    return
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("the hub closed the connection")
                self.transport.push(data)

    def sender(self, address: str, name: str) -> Any:
        link = self.session.sender(name)
        link.target.address = address
        link.open()
        return link

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()  # the socket is gone before the test's loop is


async def polled(condition: Callable[[], bool]) -> None:
    """Until ``condition()`` holds, within TIMEOUT_S: nothing signals that the hub let go of a connection or its
    socket, so this looks every 10 ms."""
    async with asyncio.timeout(TIMEOUT_S):
        while not condition():  # noqa: ASYNC110 (no event to wait for; polled, bounded)
            await asyncio.sleep(0.01)
