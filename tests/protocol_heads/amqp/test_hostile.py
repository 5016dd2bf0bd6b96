"""The AMQP head against bad input: each refusal ends only the client that sent it, with AMQP's own error."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import pytest
from proton import SASL, Connection, ConnectionException, Transport
from proton import Message as AmqpMessage
from proton.utils import LinkDetached, SendException

from edgehub.testing import InMemoryHub
from protocol_heads.amqp import AmqpServer, AmqpSettings
from tests.protocol_heads.amqp.conftest import DEV, DEVICE_KEY, HOST, ProtonClient, sas_token

pytestmark = pytest.mark.interop


@pytest.fixture
async def tight(hub: InMemoryHub) -> AsyncIterator[AmqpServer]:
    settings = AmqpSettings(tcp_port=0, tls_port=None, max_message_size=1024, max_links=3, connect_timeout_s=5.0)
    async with AmqpServer(hub, settings=settings) as server:
        yield server


async def device(port: int) -> ProtonClient:
    return await ProtonClient.connect(port, user=f"dev1@sas.{HOST}", password=sas_token(DEV, DEVICE_KEY))


async def test_garbage_gets_the_sasl_header_and_a_close_while_others_go_on(tight: AmqpServer, hub: InMemoryHub) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", tight.ports["amqp"])
    try:
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        async with asyncio.timeout(5):
            answer = await reader.read()  # to EOF: the hub closed it
        assert answer == b"AMQP\x03\x01\x00\x00"
    finally:
        writer.close()
        await writer.wait_closed()  # the socket is gone before the test's loop is
    client = await device(tight.ports["amqp"])
    try:
        await client.send(await client.sender("/devices/dev1/messages/events"), AmqpMessage(body=b"fine"))
        assert [m.body for _, m in hub.stored] == [b"fine"]
    finally:
        await client.close()
    assert tight.refusals.total >= 1


def write_on_then_read(port: int, first: bytes, then: int) -> tuple[bytes, int]:
    """Send ``first``, then ``then`` bytes more whatever the hub answers, then read to EOF: (the answer, the bytes
    sent before a reset stopped us). A blocking socket, run in a thread."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(first)
        sent = 0
        try:
            chunk = b"\0" * 65536
            while sent < then:
                sent += sock.send(chunk)
        except OSError:  # a reset (or the pipe broken by one)
            pass
        answer = b""
        with contextlib.suppress(OSError):
            while data := sock.recv(65536):
                answer += data
        return answer, sent


async def test_a_client_still_writing_after_the_close_reads_it_and_no_reset(tight: AmqpServer) -> None:
    # The hub shuts its side and drops what still comes until the client hangs up (close_grace_s at most): closing
    # with unread bytes would answer them with a reset, and a client still writing would never read the answer.
    answer, sent = await asyncio.to_thread(write_on_then_read, tight.ports["amqp"], b"GET / HTTP/1.1\r\n\r\n", 8 << 20)
    assert answer == b"AMQP\x03\x01\x00\x00"
    assert sent >= 8 << 20


def write_until_reset(port: int, first: bytes, for_s: float) -> float | None:
    """Send ``first``, then write on for at most ``for_s``: the seconds until a reset stopped us (None: never)."""
    with socket.create_connection(("127.0.0.1", port), timeout=for_s) as sock:
        sock.sendall(first)
        began = time.monotonic()
        chunk = b"\0" * 65536
        try:
            while time.monotonic() - began < for_s:
                sock.send(chunk)
        except OSError:
            return time.monotonic() - began
        return None


async def test_a_client_writing_on_for_ever_after_the_close_is_cut_off_after_the_grace(hub: InMemoryHub) -> None:
    settings = AmqpSettings(tcp_port=0, tls_port=None, connect_timeout_s=5.0, close_grace_s=0.5)
    async with AmqpServer(hub, settings=settings) as server:
        cut_after = await asyncio.to_thread(write_until_reset, server.ports["amqp"], b"GET / HTTP/1.1\r\n\r\n", 20.0)
    assert cut_after is not None  # a reset cut it off
    assert cut_after < 10.0  # after the 0.5 s grace, not the 20 s it would have written


async def test_a_client_that_closes_lets_go_of_its_socket_at_once_not_after_the_grace(hub: InMemoryHub) -> None:
    # The lingering close ends when the client hangs up; waiting out close_grace_s instead would hold every closed
    # connection's place that long.
    settings = AmqpSettings(tcp_port=0, tls_port=None, connect_timeout_s=5.0, close_grace_s=120.0)
    async with AmqpServer(hub, settings=settings) as server:
        client = await device(server.ports["amqp"])
        await client.send(await client.sender("/devices/dev1/messages/events"), AmqpMessage(body=b"fine"))
        await client.close()
        async with asyncio.timeout(30):
            while server.limiter.total:  # noqa: ASYNC110 (nothing signals a socket closed server-side; bounded)
                await asyncio.sleep(0.01)


async def test_a_message_over_the_link_limit_closes_the_link_with_message_size_exceeded(
    tight: AmqpServer, hub: InMemoryHub
) -> None:
    client = await device(tight.ports["amqp"])
    try:
        sender = await client.sender("/devices/dev1/messages/events")
        with pytest.raises((LinkDetached, SendException)) as info:
            await client.send(sender, AmqpMessage(body=b"x" * 4096))
        if isinstance(info.value, LinkDetached):
            assert "message-size-exceeded" in str(info.value)
        assert hub.stored == []
    finally:
        await client.close()


@pytest.fixture
async def quarter(hub: InMemoryHub) -> AsyncIterator[AmqpServer]:
    settings = AmqpSettings(tcp_port=0, tls_port=None, max_message_size=256 * 1024, connect_timeout_s=5.0)
    async with AmqpServer(hub, settings=settings) as server:
        yield server


async def test_a_message_over_the_link_limit_in_many_frames_closes_its_link_and_the_connection_goes_on(
    quarter: AmqpServer, hub: InMemoryHub
) -> None:
    # proton's client goes on sending the rest of the transfer after the hub has refused it: the hub drops it as it
    # comes and closes the link once it has ended, never answering on a detached link (the client would fail on a
    # handle it no longer knows, and never see our close).
    client = await device(quarter.ports["amqp"])
    try:
        sender = await client.sender("/devices/dev1/messages/events")
        with pytest.raises((LinkDetached, SendException)):
            await client.send(sender, AmqpMessage(body=b"x" * (400 * 1024)))
        after = await client.sender("/devices/dev1/messages/events", name="after")
        await client.send(after, AmqpMessage(body=b"fine"))
    finally:
        await client.close()
    assert [m.body for _, m in hub.stored] == [b"fine"]


async def test_a_refused_transfer_going_on_a_caps_worth_past_the_limit_closes_the_connection(
    quarter: AmqpServer, hub: InMemoryHub
) -> None:
    client = await device(quarter.ports["amqp"])
    try:
        sender = await client.sender("/devices/dev1/messages/events")
        with pytest.raises(ConnectionException, match="message-size-exceeded"):
            await client.send(sender, AmqpMessage(body=b"x" * (1 << 20)))
    finally:
        with contextlib.suppress(ConnectionException):
            await client.close()
    assert hub.stored == []
    assert quarter.refusals.total >= 2  # the message (too_large), then the connection (packet_too_large)


async def test_links_over_the_limit_close_the_connection_with_resource_limit_exceeded(tight: AmqpServer) -> None:
    client = await device(tight.ports["amqp"])
    try:
        for n in range(3):
            await client.sender("/devices/dev1/messages/events", name=f"l{n}")
        with pytest.raises(ConnectionException, match="resource-limit-exceeded"):
            await client.sender("/devices/dev1/messages/events", name="one too many")
    finally:
        await client.close()


async def test_a_wrong_password_is_refused_in_sasl_and_counted_by_the_throttle(tight: AmqpServer) -> None:
    with pytest.raises(ConnectionException, match=r"unauthorized|Authentication"):
        await ProtonClient.connect(tight.ports["amqp"], user=f"dev1@sas.{HOST}", password="SharedAccessSignature x")
    assert tight.connected == []
    assert tight.refusals.total == 1


def sasl_plain_outcome(port: int, source: str, user: str, password: str) -> int | None:
    """Log in with SASL PLAIN from ``source`` (127.0.0.2 and up: another source address on loopback); the SASL
    outcome code (None: the hub closed first). proton's engine on a blocking socket, run in a thread."""
    transport = Transport(Transport.CLIENT)
    sasl = transport.sasl()
    sasl.allowed_mechs("PLAIN")
    sasl.config_name("edgehub-tests")  # PLAIN over plain TCP must be allowed in so many words
    sasl.allow_insecure_mechs = True
    connection = Connection()
    connection.user = user
    connection.password = password
    connection.open()
    transport.bind(connection)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(10.0)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        while sasl.outcome is None:
            pending = transport.pending()
            if pending > 0:
                sock.sendall(bytes(transport.peek(pending)))
                transport.pop(pending)
            data = sock.recv(65536)
            if not data:
                return None
            transport.push(data)
        return int(sasl.outcome)


async def test_five_bad_logins_naming_a_device_do_not_lock_out_its_valid_login_from_another_address(
    hub: InMemoryHub,
) -> None:
    settings = AmqpSettings(tcp_port=0, tls_port=None)  # the defaults: 5 per (address, identity), 30 per address
    user = f"dev1@sas.{HOST}"
    async with AmqpServer(hub, settings=settings) as server:
        port = server.ports["amqp"]
        for _ in range(settings.max_login_failures):
            bad = await asyncio.to_thread(sasl_plain_outcome, port, "127.0.0.2", user, "SharedAccessSignature x")
            assert bad == SASL.AUTH
        good = sas_token(DEV, DEVICE_KEY)
        assert await asyncio.to_thread(sasl_plain_outcome, port, "127.0.0.3", user, good) == SASL.OK
        refused_before = server.logins.refused
        assert await asyncio.to_thread(sasl_plain_outcome, port, "127.0.0.2", user, good) == SASL.AUTH
        assert server.logins.refused == refused_before + 1  # throttled, the key not even checked
