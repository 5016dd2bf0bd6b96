"""The AMQP head's idle timeout, enforced: a logged-in client that sends nothing for ``idle_timeout_s`` gets the
idle close (``amqp:resource-limit-exceeded``, "local-idle-timeout expired"), one refusal line naming its address,
and its socket closed within ``close_grace_s``; a client that stops reading what the hub sends it (so the hub stops
reading it too) is let go the same way, its unread bytes dropped.

The client is proton's engine under a test-driven socket (``EngineClient``): it reads only when told to and never
ticks, so it sends no empty frames of its own."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator

import pytest
from proton import Disposition, Endpoint
from proton import Message as AmqpMessage

from edgehub.core import Message
from edgehub.testing import InMemoryHub
from protocol_heads.amqp import AmqpServer, AmqpSettings
from tests.protocol_heads.amqp.conftest import (
    DEV,
    DEVICE_KEY,
    HOST,
    MOD,
    MODULE_KEY,
    TIMEOUT_S,
    EngineClient,
    polled,
    sas_token,
)

pytestmark = pytest.mark.interop

LOG = "protocol_heads.amqp.server"
IDLE_S = 0.5
GRACE_S = 0.5
BODY = b"m" * 200_000  # a module's messages, many MB of them, more than the sockets' buffers hold


@pytest.fixture
async def quick(hub: InMemoryHub) -> AsyncIterator[AmqpServer]:
    settings = AmqpSettings(
        tcp_port=0,
        tls_port=None,
        idle_timeout_s=IDLE_S,
        close_grace_s=GRACE_S,
        connect_timeout_s=5.0,
        outbound_window=256,
        max_groups_in_flight=1,
    )
    async with AmqpServer(hub, settings=settings) as server:
        yield server


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG and r.getMessage().startswith("refused ")]


async def test_a_silent_logged_in_client_gets_the_idle_close_and_then_eof(
    quick: AmqpServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    client = await EngineClient.connect(quick.ports["amqp"], f"dev1@sas.{HOST}", sas_token(DEV, DEVICE_KEY))
    try:
        await client.pump_until(lambda: bool(client.connection.state & Endpoint.REMOTE_ACTIVE))
        assert quick.connected == [DEV.id]
        await silent_until_closed(client)  # silent from here
        condition = client.connection.remote_condition or client.transport.condition
        assert condition is not None
        assert condition.name == "amqp:resource-limit-exceeded"
        assert "idle" in str(condition.description)
    finally:
        await client.close()
    (line,) = [line for line in refusal_lines(caplog) if "keepalive_timeout" in line]
    assert "peer=127.0.0.1" in line
    await polled(lambda: quick.connected == [] and quick.limiter.total == 0)


async def test_a_module_that_stops_reading_is_let_go_after_its_idle_timeout(
    quick: AmqpServer, hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    client = await EngineClient.connect(quick.ports["amqp"], f"dev1/filter@sas.{HOST}", sas_token(MOD, MODULE_KEY))
    try:
        receiver = client.session.receiver("inputs")
        receiver.source.address = "/devices/dev1/modules/filter/messages/events"
        receiver.open()
        receiver.flow(256)
        await client.pump_until(lambda: bool(receiver.state & Endpoint.REMOTE_ACTIVE))
        await client.pump_until(lambda: quick.connected == [MOD.id])
        for n in range(256):
            hub.enqueue(MOD, "in1", Message(BODY, {"n": str(n)}))
        # The client reads nothing more: the hub's writes back up until it stops reading the client too.
        await polled(lambda: any("not_reading" in line for line in refusal_lines(caplog)))
        await polled(lambda: quick.limiter.total == 0)  # the socket is gone, though its peer never read
        (line,) = [line for line in refusal_lines(caplog) if "not_reading" in line]
        assert "peer=127.0.0.1" in line
        assert hub.pending(MOD) == 256  # nothing settled: all of it is redelivered on the next link
    finally:
        await client.close()


def is_open(client: EngineClient) -> bool:
    return bool(client.connection.state & Endpoint.REMOTE_ACTIVE)


async def silent_until_closed(client: EngineClient) -> None:
    """Read only, until the hub closes the socket."""
    async with asyncio.timeout(IDLE_S + GRACE_S + TIMEOUT_S):
        while data := await client.reader.read(65536):
            client.transport.push(data)


async def test_a_client_the_hub_stopped_reading_while_it_stores_is_not_taken_for_silent(
    quick: AmqpServer, hub: InMemoryHub
) -> None:
    client = await EngineClient.connect(quick.ports["amqp"], f"dev1@sas.{HOST}", sas_token(DEV, DEVICE_KEY))
    try:
        link = client.sender("/devices/dev1/messages/events", "telemetry")
        await client.pump_until(lambda: link.credit > 0)
        hub.hold()
        delivery = link.delivery("1")
        link.send(AmqpMessage(body=b"held").encode())
        link.advance()
        await client.pump_until(lambda: True)  # written
        await hub.wait_held(1)  # one group waiting on the hub: the head reads this client no more
        # Silent clients, one after the other, each closed for its silence: a clock. proton notices silence at
        # its next tick, up to an idle timeout late; after three, this client's idle timeout has passed twice
        # over, all of it while the hub was not reading it.
        for _ in range(3):
            later = await EngineClient.connect(quick.ports["amqp"], "plain", "secret")
            try:
                await later.pump_until(functools.partial(is_open, later))
                await silent_until_closed(later)
            finally:
                await later.close()
        assert quick.connected == [DEV.id]
        hub.release()
        await client.pump_until(lambda: delivery.settled)
        assert delivery.remote_state == Disposition.ACCEPTED
    finally:
        await client.close()
