"""A will the hub does not take is a refusal like any other (every refusal is one rate-limited line with
the client id and the reason): a will topic the client may not publish to, and a will on a topic that is not a
message, each log one ``refused`` line and store nothing. Before, the first was dropped without a word and the
second logged an unlimited ``mqtt.will_dropped`` line."""

from __future__ import annotations

import asyncio
import logging

import pytest

from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import Connect, Will
from edgehub.testing import InMemoryHub
from protocol_heads.mqtt.server import MqttServer
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, sas_password, username

LOG = "protocol_heads.mqtt.server"


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        ("devices/dev2/messages/events/", "not_authorized"),  # another device's telemetry
        ("$iothub/twin/PATCH/properties/reported/?$rid=1", "topic_invalid"),  # allowed, but not a message
    ],
)
async def test_a_will_the_hub_does_not_take_is_one_refusal_line_with_client_and_reason(
    head: MqttServer, hub: InMemoryHub, caplog: pytest.LogCaptureFixture, topic: str, reason: str
) -> None:
    caplog.set_level(logging.INFO, LOG)
    reader, writer = await asyncio.open_connection("127.0.0.1", head.ports["tcp"])
    connect = Connect(
        "dev1", username=username(DEV), password=sas_password(DEV, DEVICE_KEY).encode(), will=Will(topic, b"gone")
    )
    writer.write(encode(connect))
    async with asyncio.timeout(10):
        assert (await reader.read(4))[:1] == b"\x20"  # CONNACK
        writer.close()  # vanish without DISCONNECT: the will is due
        await writer.wait_closed()
        await hub.wait_disconnected(DEV)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert [line for line in lines if f"reason={reason}" in line and "client=dev1" in line and "will=" in line]
    assert hub.stored == []
