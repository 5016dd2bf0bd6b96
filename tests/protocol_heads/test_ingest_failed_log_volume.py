"""A store that cannot write makes every head close the connection of each client that sends, and say so in a
WARNING line: twenty clients (or one, twenty times) that send into it log at most the rate limiter's burst of
those lines, not one each. Both heads, each over the in-memory hub told to fail with a ``StoreClosedError``, real
clients on 127.0.0.1 port 0 (a byte-level MQTT client, proton's engine for AMQP)."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from proton import Message as AmqpMessage

from edgehub.core import StoreClosedError
from edgehub.mqtt.packets import MQTT_311, ConnAck, Connect, Publish
from edgehub.testing import InMemoryHub
from protocol_heads.amqp import AmqpServer, AmqpSettings
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.amqp.conftest import EngineClient
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, sas_password, username
from tests.protocol_heads.mqtt.rawclient import RawClient

pytestmark = [pytest.mark.timeout(60)]

BURST = 5  # RateLimitedLog's default: lines per key per minute
TRIES = 20


def warnings(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and event in r.getMessage()]


def has_credit(link: Any) -> bool:
    return bool(link.credit > 0)


@pytest.fixture
def hub() -> InMemoryHub:
    h = InMemoryHub(host_name=HOST)
    h.add_identity(DEV, key_b64=DEVICE_KEY)
    return h


@pytest.fixture
async def mqtt_head(hub: InMemoryHub) -> AsyncIterator[MqttServer]:
    async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
        yield server


async def test_mqtt_clients_sending_into_a_broken_store_log_a_few_ingest_failed_lines(
    mqtt_head: MqttServer, hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    login = Connect(
        DEV.id, protocol_level=MQTT_311, username=username(DEV), password=sas_password(DEV, DEVICE_KEY).encode()
    )
    for _ in range(TRIES):
        client = await RawClient.open(mqtt_head.ports["tcp"], level=MQTT_311)
        try:
            assert await client.login(login) == ConnAck(0, False)
            hub.fail_next_ingest(StoreClosedError("store closed"))
            client.send(Publish("devices/dev1/messages/events/", b"x", qos=1, packet_id=1))
            assert await client.closed_by_server()  # the message unacknowledged
        finally:
            await client.close()
    lines = warnings(caplog, "mqtt.ingest_failed")
    assert 1 <= len(lines) <= BURST, lines
    assert "detail=store closed" in lines[0]
    assert hub.stored == []


async def test_amqp_clients_sending_into_a_broken_store_log_a_few_ingest_failed_lines(
    hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with AmqpServer(hub, settings=AmqpSettings(tcp_port=0, tls_port=None)) as head:
        for _ in range(TRIES):
            client = await EngineClient.connect(head.ports["amqp"], f"dev1@sas.{HOST}", sas_password(DEV, DEVICE_KEY))
            try:
                link = client.sender("/devices/dev1/messages/events", "telemetry")
                await client.pump_until(functools.partial(has_credit, link))
                hub.fail_next_ingest(StoreClosedError("store closed"))
                link.delivery("1")
                link.send(AmqpMessage(body=b"x").encode())
                link.advance()
                with pytest.raises(ConnectionError):  # the head closes the connection, the transfer unsettled
                    await client.pump_until(lambda: False)
            finally:
                await client.close()
    lines = warnings(caplog, "amqp.ingest_failed")
    assert 1 <= len(lines) <= BURST, lines
    assert hub.stored == []
