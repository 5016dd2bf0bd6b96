"""The real hub end to end: paho-mqtt 2.x devices and modules over real sockets, routes, the RocksDB store and
the module endpoint's executors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import parse_qsl

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import Connect, Publish
from edgehub.store import QueueId, QueuePolicy
from tests.e2e.conftest import DEV, FILTER, IN1, KEYS, SENSOR, Rig, running_hub, sas, username
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

INPUTS = "devices/edge/modules/filter/inputs/"


def bag(topic: str, prefix: str) -> dict[str, str]:
    assert topic.startswith(prefix), topic
    return dict(parse_qsl(topic[len(prefix) :], keep_blank_values=True))


async def module(rig: Rig, *, clean_session: bool | None = None) -> Paho:
    mod = Paho.make(FILTER.id, clean_session=clean_session)
    rc = await mod.connect(rig.tcp, user=username(FILTER), password=sas(FILTER))
    assert rc == 0
    mod.client.subscribe(f"{INPUTS}#", qos=1)
    async with asyncio.timeout(10):
        assert await mod.subscribes.get() == [1]
    return mod


async def device(rig: Rig, protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv311) -> Paho:
    dev = Paho.make(DEV.id, protocol=protocol)
    rc = await dev.connect(rig.tls, tls_ca=rig.ca.ca_pem, user=username(DEV), password=sas(DEV))
    assert rc == 0
    return dev


def queued(rig: Rig, endpoint: str = IN1) -> int:
    return sum(rig.store.count(q) for q in rig.store.queues(endpoint))


async def test_device_telemetry_is_routed_stored_and_delivered_to_the_module_with_properties_intact(
    tmp_path: Path,
) -> None:
    async with running_hub(tmp_path) as rig:
        mod = await module(rig)
        dev = await device(rig, mqtt.MQTTv5)
        props = PahoProperties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ContentType = "application/json"
        props.UserProperty = [("severity", "high")]
        mid = dev.publish("devices/dev1/messages/events/$.mid=m-1&unit=%C2%B0C", b'{"t": 21}', properties=props)
        async with asyncio.timeout(10):
            assert await dev.publishes.get() == (mid, 0)
            got = await mod.messages.get()
        assert got.payload == b'{"t": 21}'
        assert got.qos == 1
        props_in = bag(got.topic, f"{INPUTS}in1/")
        assert props_in["$.mid"] == "m-1"
        assert props_in["$.ct"] == "application/json"
        assert props_in["$.cdid"] == "dev1"
        assert props_in["unit"] == "°C"
        assert props_in["severity"] == "high"
        # The module's PUBACK lets the executor checkpoint the message.
        executor = rig.hub.executors[IN1]
        async with asyncio.timeout(10):
            await executor.wait_for(lambda: all(rig.store.checkpoint(q).committed >= 0 for q in rig.store.queues(IN1)))
        await dev.close()
        await mod.close()


async def test_module_to_module_through_a_route_keeps_the_output_name_out_and_properties_in(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as rig:
        mod = await module(rig)
        sensor = Paho.make(SENSOR.id)
        assert await sensor.connect(rig.tcp, user=username(SENSOR), password=sas(SENSOR)) == 0
        mids = [
            sensor.publish(f"devices/edge/modules/sensor/messages/events/$.on=out1&$.mid=s{i}&n={i}", f"r{i}".encode())
            for i in range(5)
        ]
        async with asyncio.timeout(10):
            acks = [await sensor.publishes.get() for _ in mids]
            got = [await mod.messages.get() for _ in mids]
        assert sorted(acks) == sorted((m, 0) for m in mids)
        assert [m.payload for m in got] == [f"r{i}".encode() for i in range(5)]
        first = bag(got[0].topic, f"{INPUTS}fromsensor/")
        assert first["$.mid"] == "s0"
        assert first["n"] == "0"
        assert first["$.cmid"] == "sensor"
        await sensor.close()
        await mod.close()


async def test_a_module_that_connects_later_gets_its_queued_messages_at_once(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as rig:
        dev = await device(rig)
        mids = [dev.publish(f"devices/dev1/messages/events/$.mid=q{i}", f"q{i}".encode()) for i in range(3)]
        async with asyncio.timeout(10):
            acks = [await dev.publishes.get() for _ in mids]
        assert [rc for _, rc in acks] == [0, 0, 0]
        assert queued(rig) == 3  # PUBACK came after the message was in the module's queue
        executor = rig.hub.executors[IN1]
        async with asyncio.timeout(10):
            await executor.wait_for(lambda: executor.sends.batches >= 1)  # tried: the module is absent
        # The retry wait is 600 s (LONG_WAIT): the module's arrival must cut it short.
        mod = await module(rig)
        async with asyncio.timeout(10):
            got = [await mod.messages.get() for _ in mids]
        assert [m.payload for m in got] == [b"q0", b"q1", b"q2"]
        await dev.close()
        await mod.close()


async def test_a_restarted_hub_still_holds_and_delivers_what_it_acknowledged(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as rig:
        dev = await device(rig)
        mids = [dev.publish("devices/dev1/messages/events/", f"keep{i}".encode()) for i in range(2)]
        async with asyncio.timeout(10):
            assert sorted([await dev.publishes.get() for _ in mids]) == sorted((m, 0) for m in mids)
        await dev.close()
    async with running_hub(tmp_path) as rig:
        assert queued(rig) == 2
        mod = await module(rig)
        async with asyncio.timeout(10):
            got = [await mod.messages.get() for _ in range(2)]
        assert [m.payload for m in got] == [b"keep0", b"keep1"]
        await mod.close()


async def test_an_unacknowledged_delivery_comes_again_as_dup_after_the_module_reconnects(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as rig:
        reader, writer = await asyncio.open_connection("127.0.0.1", rig.tcp)
        writer.write(encode(Connect(FILTER.id, username=username(FILTER), password=sas(FILTER).encode())))
        decoder = Decoder(protocol_level=4)
        dev = await device(rig)
        async with asyncio.timeout(10):
            while not decoder.receive_data(await reader.read(1024)):
                pass  # CONNACK
            dev.publish("devices/dev1/messages/events/", b"once")
            first: list[object] = []
            while not first:
                first = list(decoder.receive_data(await reader.read(1024)))
        [publish] = first
        assert isinstance(publish, Publish)
        assert not publish.dup
        writer.close()  # gone without PUBACK
        await writer.wait_closed()
        mod = await module(rig, clean_session=False)
        async with asyncio.timeout(10):
            again = await mod.messages.get()
        assert again.payload == b"once"
        assert again.dup
        await dev.close()
        await mod.close()


async def test_a_bad_sas_key_is_refused(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as rig:
        dev = Paho.make(DEV.id, protocol=mqtt.MQTTv5)
        rc = await dev.connect(rig.tcp, user=username(DEV), password=sas(DEV, KEYS[FILTER.id]))
        assert rc.value == 0x87
        await dev.close()


async def test_a_full_module_queue_answers_quota_exceeded_with_reason_0x97(tmp_path: Path) -> None:
    policy = QueuePolicy(max_messages=1, enqueue_timeout_s=0)
    async with running_hub(tmp_path, policies={IN1: policy}) as rig:
        dev = await device(rig, mqtt.MQTTv5)
        first = dev.publish("devices/dev1/messages/events/", b"fits")
        async with asyncio.timeout(10):
            assert await dev.publishes.get() == (first, 0)
        second = dev.publish("devices/dev1/messages/events/", b"over")
        async with asyncio.timeout(10):
            assert await dev.publishes.get() == (second, 0x97)
        assert queued(rig) == 1
        assert [QueueId.parse(q.name).endpoint for q in rig.store.queues(IN1)] == [IN1]
        await dev.close()
