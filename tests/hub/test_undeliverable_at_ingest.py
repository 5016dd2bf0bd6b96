"""Refused at ingest what no routed endpoint can ever carry, through the real hub (RocksDB in tmp_path) with the
MQTT carriage (``protocol_heads.mqtt.carriage``: a hub whose modules and devices can only connect over MQTT): a
message whose properties make its module-input topic longer than MQTT's 65,535 bytes is answered
``Rejected("undeliverable")``, nothing of it is stored, it is counted and logged at a bounded rate; an MQTT 5
device gets PUBACK 0x83, an MQTT 3.1.1 device is disconnected (it has no negative ack), an AMQP device's transfer
is rejected with ``amqp:not-allowed``. A message one of its endpoints can carry is stored as before. Before, every
such message was stored and dead-lettered at its first delivery."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from paho.mqtt.enums import MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from proton import Disposition
from proton import Message as AmqpMessage

from edgehub.core import Message
from edgehub.core.refusals import RefusalReason
from edgehub.hub import Rejected, Stored
from edgehub.hub.facade import EdgeHub
from edgehub.routing import Router
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from protocol_heads.amqp import AmqpServer, AmqpSettings
from protocol_heads.mqtt.carriage import MqttCarriage
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.amqp.conftest import EngineClient, sas_token
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, MOD, MODULE_KEY, Paho, sas_password, username

pytestmark = [pytest.mark.timeout(60)]

INPUT = "/modules/filter/inputs/in"
TO_MODULE = {"to_filter": f"FROM /messages/* INTO BrokeredEndpoint('{INPUT}')"}
BIG = {"a": "é" * 20_000, "b": "é" * 20_000, "c": "é" * 20_000}  # 120 KB; its bag in a topic, 360 KB


@asynccontextmanager
async def served(data: Path, routes: dict[str, str] = TO_MODULE) -> AsyncIterator[tuple[EdgeHub, Store]]:
    store = open_rocks_store(data / "store")
    try:
        async with EdgeHub(store=store, router=Router(routes), host_name=HOST, carriage=MqttCarriage()) as hub:
            await hub.identities.add_symmetric_key(DEV, DEVICE_KEY)
            await hub.identities.add_symmetric_key(MOD, MODULE_KEY)
            yield hub, store
    finally:
        await store.close()


def stored_count(store: Store) -> int:
    return sum(store.end_offset(q) for q in store.queues())


MQTT_ONLY = MqttSettings(tcp_port=0, tls_port=None)


async def test_a_message_no_routed_endpoint_can_carry_is_refused_stored_nowhere_counted_and_logged_a_few_times(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with served(tmp_path) as (hub, store):
        outcomes = await hub.ingest(DEV, [Message(b"big", dict(BIG), {"messageId": f"m{n}"}) for n in range(20)])
        assert all(isinstance(o, Rejected) and o.reason == RefusalReason.UNDELIVERABLE for o in outcomes)
        first = outcomes[0]
        assert isinstance(first, Rejected)
        assert "over MQTT's 65,535" in first.detail
        assert INPUT in first.detail
        assert stored_count(store) == 0
        assert hub.ingest_refused == {RefusalReason.UNDELIVERABLE: 20}
        small = await hub.ingest(DEV, [Message(b"fine", {"a": "é" * 100}, {})])
        assert isinstance(small[0], Stored)
        assert stored_count(store) == 1
    lines = [r.getMessage() for r in caplog.records if "reason=undeliverable" in r.getMessage()]
    assert 1 <= len(lines) <= 5, lines  # 20 refusals, a few lines: RefusalLog's rate


async def test_a_message_one_routed_endpoint_can_carry_is_stored_for_all_of_them(tmp_path: Path) -> None:
    routes = {**TO_MODULE, "up": "FROM /messages/* INTO $upstream"}
    async with served(tmp_path, routes) as (hub, store):
        outcomes = await hub.ingest(DEV, [Message(b"big", dict(BIG), {"messageId": "m1"})])
        assert isinstance(outcomes[0], Stored)
        assert stored_count(store) == 2  # the module's copy is dead-lettered at delivery, as before
        assert hub.ingest_refused == {}


async def test_without_a_carriage_the_hub_stores_it_and_leaves_it_to_delivery(tmp_path: Path) -> None:
    store = open_rocks_store(tmp_path / "store")
    try:
        async with EdgeHub(store=store, router=Router(TO_MODULE), host_name=HOST) as hub:
            outcomes = await hub.ingest(DEV, [Message(b"big", dict(BIG), {})])
        assert isinstance(outcomes[0], Stored)
    finally:
        await store.close()


async def device(server: MqttServer, protocol: MQTTProtocolVersion) -> Paho:
    client = Paho.make(DEV.id, protocol=protocol)
    token = sas_password(DEV, DEVICE_KEY, expiry_s=int(time.time()) + 3600)
    assert await client.connect(server.ports["tcp"], user=username(DEV), password=token) == 0
    return client


async def test_an_mqtt5_device_gets_puback_0x83_and_its_next_message_is_taken(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, store), MqttServer(hub, settings=MQTT_ONLY) as server:
        client = await device(server, MQTTProtocolVersion.MQTTv5)
        try:
            props = PahoProperties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.UserProperty = list(BIG.items())
            mid = client.publish("devices/dev1/messages/events/", b"big", qos=1, properties=props)
            async with asyncio.timeout(10):
                assert await client.publishes.get() == (mid, 0x83)
            mid = client.publish("devices/dev1/messages/events/a=1", b"fine", qos=1)
            async with asyncio.timeout(10):
                assert await client.publishes.get() == (mid, 0)
            assert stored_count(store) == 1
            assert hub.ingest_refused == {RefusalReason.UNDELIVERABLE: 1}
        finally:
            await client.close()


async def test_an_mqtt311_device_is_disconnected_for_it_as_for_every_refusal(tmp_path: Path) -> None:
    # A 3.1.1 device's properties are its topic's: only under a topic limit raised to MQTT's own can they be long
    # enough (the head's default, 4,096 characters, refuses the topic itself first).
    settings = MqttSettings(tcp_port=0, tls_port=None, max_topic_length=65_535)
    async with served(tmp_path) as (hub, store), MqttServer(hub, settings=settings) as server:
        client = await device(server, MQTTProtocolVersion.MQTTv311)
        try:
            # The inbound topic just fits MQTT (65,533 bytes); the module's topic for it cannot: its own prefix
            # and $.cdid come on top of the same bag.
            topic = "devices/dev1/messages/events/a=" + "%C3%A9" * 10_917
            assert len(topic) == 65_533
            client.publish(topic, b"big", qos=1)
            async with asyncio.timeout(10):
                await client.disconnects.get()
            assert stored_count(store) == 0
            assert hub.ingest_refused == {RefusalReason.UNDELIVERABLE: 1}
        finally:
            await client.close()


def amqp_token() -> str:
    return sas_token(DEV, DEVICE_KEY, expiry_s=int(time.time()) + 3600)  # within the real hub's token lifetime


async def test_an_amqp_device_gets_rejected_with_not_allowed(tmp_path: Path) -> None:
    settings = AmqpSettings(tcp_port=0, tls_port=None)
    async with served(tmp_path) as (hub, store), AmqpServer(hub, settings=settings) as server:
        client = await EngineClient.connect(server.ports["amqp"], f"dev1@sas.{HOST}", amqp_token())
        try:
            link = client.sender("/devices/dev1/messages/events", "telemetry")
            await client.pump_until(lambda: link.credit > 0)
            delivery = link.delivery("1")
            message = AmqpMessage(body=b"big")
            message.properties = dict(BIG)
            link.send(message.encode())
            link.advance()
            await client.pump_until(lambda: delivery.settled)
            assert delivery.remote_state == Disposition.REJECTED
            assert delivery.remote.condition is not None
            assert delivery.remote.condition.name == "amqp:not-allowed"
            assert "65,535" in (delivery.remote.condition.description or "")
            assert stored_count(store) == 0
            assert hub.ingest_refused == {RefusalReason.UNDELIVERABLE: 1}
        finally:
            await client.close()
