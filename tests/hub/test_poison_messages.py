"""Poison messages (issue 34, item 3) through the real hub: RocksDB in tmp_path, the MQTT head on 127.0.0.1 port 0,
paho clients. A message that can never be delivered to its endpoint (here: a property bag that makes the MQTT
topic longer than 65,535 bytes) is dead-lettered at once with its reason, logged and counted, and the message
queued behind it is delivered; before, it was retried at the head of its queue for its whole TTL."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from edgehub.core import Identity, Message
from edgehub.core.endpoints import device_endpoint
from edgehub.delivery import ExecutorSettings, RetryPolicy
from edgehub.hub import Stored
from edgehub.hub.facade import EdgeHub
from edgehub.routing import Router
from edgehub.store import RemovalReason, Store
from edgehub.store.rocks import open_rocks_store
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, MOD, MODULE_KEY, Paho, sas_password, username

pytestmark = [pytest.mark.timeout(60)]

INPUT = "/modules/filter/inputs/in"
DEVICEBOUND = device_endpoint("dev1")
# A retry after ten minutes: a poison message treated as transient would hold the queue past every wait below.
LONG_WAIT = ExecutorSettings(retry_policy=RetryPolicy(minimum_delay_s=600.0, maximum_delay_s=600.0))


@asynccontextmanager
async def served(data: Path) -> AsyncIterator[tuple[EdgeHub, MqttServer, Store]]:
    store = open_rocks_store(data / "store")
    try:
        router = Router({"to_filter": f"FROM /messages/* INTO BrokeredEndpoint('{INPUT}')"})
        async with EdgeHub(store=store, router=router, host_name=HOST, executor_settings=LONG_WAIT) as hub:
            await hub.identities.add_symmetric_key(DEV, DEVICE_KEY)
            await hub.identities.add_symmetric_key(MOD, MODULE_KEY)
            async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
                yield hub, server, store
    finally:
        await store.close()


async def connected(server: MqttServer, identity: Identity, key: str, topic_filter: str) -> Paho:
    client = Paho.make(identity.id)
    token = sas_password(identity, key, expiry_s=int(time.time()) + 3600)
    assert await client.connect(server.ports["tcp"], user=username(identity), password=token) == 0
    client.client.subscribe(topic_filter, qos=1)
    async with asyncio.timeout(10):
        assert await client.subscribes.get() == [1]
    return client


def poison(**properties: str) -> Message:
    return Message(b"poison", properties, {"messageId": "poison"})


def good() -> Message:
    return Message(b"good", {"n": "1"}, {"messageId": "good"})


async def test_a_module_input_message_whose_topic_would_pass_65535_bytes_is_dead_lettered_and_the_next_arrives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with served(tmp_path) as (hub, server, store):
        module = await connected(server, MOD, MODULE_KEY, "devices/dev1/modules/filter/inputs/#")
        try:
            # 3 x 20,000 "é": 120 KB of properties, taken at ingest; percent-encoded in the topic, 360 KB
            bad = poison(a="é" * 20_000, b="é" * 20_000, c="é" * 20_000)
            assert all(isinstance(o, Stored) for o in await hub.ingest(DEV, [bad, good()]))
            async with asyncio.timeout(10):
                delivered = await module.messages.get()
            assert delivered.payload == b"good"
            async with asyncio.timeout(10):  # the batch is settled (its dead letter written) once the module acked
                await hub.executors[INPUT].wait_for(lambda: len(store.dead_letters(INPUT)) == 1)
                # The record is readable as soon as its write is durable, a moment before the executor's task
                # resumes to log it; once the pump idles, that batch is settled whole.
                await hub.executors[INPUT].wait_idle()
            [dead] = store.dead_letters(INPUT)
            counted = store.removed[RemovalReason.DEADLETTER]
        finally:
            await module.close()
    assert dead.message.body == b"poison"
    assert dead.reason == "invalid"
    assert dead.error is not None
    assert "over MQTT's 65,535" in dead.error
    assert counted == 1
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("store.dead_lettered")]
    assert len(lines) == 1
    assert "reason=invalid" in lines[0]
    assert "65,535" in lines[0]


async def test_a_device_bound_message_whose_topic_would_pass_65535_bytes_is_dead_lettered_and_the_next_arrives(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (hub, server, store):
        device = await connected(server, DEV, DEVICE_KEY, "devices/dev1/messages/devicebound/#")
        try:
            await hub.cloud_to_device("dev1", poison(p="é" * 32_000))
            await hub.cloud_to_device("dev1", good())
            async with asyncio.timeout(10):
                delivered = await device.messages.get()
            assert delivered.payload == b"good"
            async with asyncio.timeout(10):
                await hub.executors[DEVICEBOUND].wait_for(lambda: len(store.dead_letters(DEVICEBOUND)) == 1)
            [dead] = store.dead_letters(DEVICEBOUND)
        finally:
            await device.close()
    assert dead.message.body == b"poison"
    assert dead.error is not None
    assert "over MQTT's 65,535" in dead.error
