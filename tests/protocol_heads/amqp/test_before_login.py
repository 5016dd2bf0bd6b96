"""What an AMQP connection may hold before its client has logged in (SASL ANONYMOUS or no SASL layer at all, as the
Azure SDKs open, and no ``$cbs`` token yet; each test runs both ways): a
few sessions, a few links and a few KB of unfinished transfers. Past one of them the hub closes the connection
with ``amqp:resource-limit-exceeded`` and a description naming the bound, and logs one refusal line with the
client's address; once a token is checked the connection's usual bounds hold.

The client is proton's engine under a test-driven socket (``EngineClient``), so a test can leave a transfer
unfinished and read the hub's close itself."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from proton import Endpoint
from proton import Message as AmqpMessage

from edgehub.testing import InMemoryHub
from protocol_heads.amqp import AmqpServer, AmqpSettings
from tests.protocol_heads.amqp.conftest import (
    DEV,
    DEVICE_KEY,
    HOST,
    EngineClient,
    ProtonClient,
    put_token,
    sas_token,
)

pytestmark = pytest.mark.interop

LOG = "protocol_heads.amqp.server"


@pytest.fixture
async def bounded(hub: InMemoryHub) -> AsyncIterator[AmqpServer]:
    settings = AmqpSettings(
        tcp_port=0,
        tls_port=None,
        connect_timeout_s=5.0,
        max_sessions_before_login=2,
        max_links_before_login=4,
        max_unfinished_bytes_before_login=16 * 1024,
    )
    async with AmqpServer(hub, settings=settings) as server:
        yield server


@pytest.fixture(params=["ANONYMOUS", None], ids=["anonymous", "no-sasl"])
def mechs(request: pytest.FixtureRequest) -> str | None:
    mechanism: str | None = request.param
    return mechanism


async def stranger(server: AmqpServer, mechs: str | None) -> EngineClient:
    client = await EngineClient.connect(server.ports["amqp"], None, None, mechs=mechs)
    await client.pump_until(lambda: bool(client.connection.state & Endpoint.REMOTE_ACTIVE))
    return client


async def closed_with(client: EngineClient) -> tuple[str, str]:
    """Pump until the hub closes the connection; its condition's name and description."""
    await client.pump_until(lambda: bool(client.connection.state & Endpoint.REMOTE_CLOSED))
    condition = client.connection.remote_condition
    assert condition is not None
    return str(condition.name), str(condition.description)


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG and r.getMessage().startswith("refused ")]


def the_one_refusal(caplog: pytest.LogCaptureFixture) -> str:
    (line,) = refusal_lines(caplog)
    assert "reason=too_much_before_login" in line
    assert "peer=127.0.0.1" in line
    return line


async def test_a_client_not_logged_in_that_begins_too_many_sessions_is_closed_with_resource_limit_exceeded(
    bounded: AmqpServer, caplog: pytest.LogCaptureFixture, mechs: str | None
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    client = await stranger(bounded, mechs)
    try:
        for _ in range(2):  # with the one it began at the start: three
            client.connection.session().open()
        name, description = await closed_with(client)
    finally:
        await client.close()
    assert name == "amqp:resource-limit-exceeded"
    assert "sessions before login" in description
    assert "sessions before login" in the_one_refusal(caplog)


async def test_a_client_not_logged_in_that_attaches_too_many_links_is_closed_with_resource_limit_exceeded(
    bounded: AmqpServer, caplog: pytest.LogCaptureFixture, mechs: str | None
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    client = await stranger(bounded, mechs)
    try:
        for n in range(5):
            client.sender("$cbs", f"cbs-{n}")
        name, description = await closed_with(client)
    finally:
        await client.close()
    assert name == "amqp:resource-limit-exceeded"
    assert "links before login" in description
    assert "links before login" in the_one_refusal(caplog)


async def test_a_client_not_logged_in_that_leaves_large_transfers_unfinished_is_closed_with_resource_limit_exceeded(
    bounded: AmqpServer, caplog: pytest.LogCaptureFixture, mechs: str | None
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    client = await stranger(bounded, mechs)
    try:
        links = [client.sender("$cbs", f"cbs-{n}") for n in range(2)]
        await client.pump_until(lambda: all(link.credit > 0 for link in links))
        for link in links:
            link.delivery(link.name)
            link.send(b"\x00" * 12 * 1024)  # never advanced: each transfer stays unfinished (more to come)
        name, description = await closed_with(client)
    finally:
        await client.close()
    assert name == "amqp:resource-limit-exceeded"
    assert "unfinished bytes before login" in description
    assert "unfinished bytes before login" in the_one_refusal(caplog)


async def test_once_its_token_is_checked_a_client_may_attach_more_links_than_before_login(
    bounded: AmqpServer, hub: InMemoryHub, mechs: str | None
) -> None:
    client = await ProtonClient.connect(bounded.ports["amqp"], mechs=mechs)
    try:
        answer = await put_token(client, f"{HOST}/devices/dev1", sas_token(DEV, DEVICE_KEY))
        assert answer.properties["status-code"] == 200
        senders = [await client.sender("/devices/dev1/messages/events", name=f"t{n}") for n in range(5)]
        for n, sender in enumerate(senders):  # with the two $cbs links, seven links: over the bound before login
            await client.send(sender, AmqpMessage(body=f"m{n}".encode()))
        assert [m.body for _, m in hub.stored] == [f"m{n}".encode() for n in range(5)]
    finally:
        await client.close()
    assert bounded.refusals.total == 0
