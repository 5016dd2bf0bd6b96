"""The upstream against a second broker implementation, amqtt's (in process, MQTT 3.1.1), besides Mosquitto: a
batch cut into several segments goes out, each PUBLISH acknowledged and relayed. (amqtt drops the ``$iothub``
topics the twin and method calls use, so those are tested against Mosquitto.)"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
from amqtt.broker import Broker
from amqtt.client import MQTTClient

from edgehub.core import Message
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.testing.peers import free_port
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


@pytest.fixture
async def amqtt_port() -> AsyncIterator[int]:
    port = free_port()
    anonymous = {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}}
    broker = Broker({"listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}}, "plugins": anonymous})
    await broker.start()
    try:
        yield port
    finally:
        await broker.shutdown()


async def test_the_upstream_delivers_its_segments_to_amqtt_each_acknowledged(amqtt_port: int) -> None:
    cloud = MQTTClient(client_id="cloud")
    settings = MqttUpstreamSettings(
        host="127.0.0.1", port=amqtt_port, client_id="hub1", hub_id="hub1", max_batch_bytes=1024
    )
    batch = [
        QueuedMessage(message=Message(body=os.urandom(300)), offset=i, priority=0, enqueued_at_s=1.7e9, ttl_s=60)
        for i in range(10)
    ]
    try:
        async with asyncio.timeout(30):
            await cloud.connect(f"mqtt://127.0.0.1:{amqtt_port}/")
            await cloud.subscribe([("edgehub/segments/#", 1)])
            async with MqttUpstream(settings) as up:
                await up.wait_connected()
                result = await up.send(batch)
                assert [q.offset for q in result.succeeded] == list(range(10))
                publishes = int(result.details["publishes"])
                assert publishes > 1  # several PUBLISHes in flight at once, each settled by its own PUBACK
                for _ in range(publishes):
                    segment = await cloud.deliver_message()
                    assert segment is not None
                    assert segment.topic == "edgehub/segments/hub1/upstream/p00"
                assert up.status().publishes_acked == publishes
    finally:
        await cloud.disconnect()
