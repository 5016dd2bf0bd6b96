"""The composition root with an upstream: a device's telemetry routed to ``$upstream`` reaches a real Mosquitto,
over one lane or, with partitions, over one connection per lane."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from edgehub.core import Identity
from edgehub.hub.lanes import stable_partition
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.serve import serve
from edgehub.runtime.compose.store import open_identities, open_store
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, WireMode
from edgehub.upstream.segment import SegmentRecord, decode_segment
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


async def test_telemetry_routed_to_upstream_is_published_to_the_configured_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}))
    store = open_store(data)
    dev = Identity.parse("dev1")
    await open_identities(store, "localhost", data_dir=data).set_password(dev, b"pw")
    await store.close()
    async with MosquittoPeer(tmp_path) as broker:
        watcher = Paho.make("watcher")
        assert await watcher.connect(broker.port) == 0
        watcher.client.subscribe("devices/#", qos=1)
        async with asyncio.timeout(10):
            await watcher.subscribes.get()
        upstream = MqttUpstreamSettings(
            host="127.0.0.1", port=broker.port, client_id="gw", hub_id="gw", wire_mode=WireMode.MESSAGE, linger_s=0.0
        )
        config = HubConfig(manifest=manifest, data_dir=data, mqtt_port=0, mqtts_port=None, upstream=upstream)
        stop = asyncio.Event()
        ports: asyncio.Queue[dict[str, int]] = asyncio.Queue()
        task = asyncio.create_task(serve(config, stop=stop, on_ready=ports.put_nowait))
        async with asyncio.timeout(20):
            port = (await ports.get())["tcp"]
        device = Paho.make("dev1")
        assert await device.connect(port, user="dev1", password="pw") == 0
        device.publish("devices/dev1/messages/events/$.mid=u1&k=v", b"to the cloud")
        async with asyncio.timeout(20):
            got = await watcher.messages.get()
        assert got.payload == b"to the cloud"
        prefix = "devices/gw/messages/events/"
        assert got.topic.startswith(prefix)
        bag = dict(parse_qsl(got.topic[len(prefix) :]))
        assert bag == {"$.mid": "u1", "$.cdid": "dev1", "k": "v"}
        await device.close()
        await watcher.close()
        stop.set()
        async with asyncio.timeout(20):
            await task


async def _serve(config: HubConfig) -> tuple[asyncio.Task[None], asyncio.Event, int]:
    stop = asyncio.Event()
    ports: asyncio.Queue[dict[str, int]] = asyncio.Queue()
    task = asyncio.create_task(serve(config, stop=stop, on_ready=ports.put_nowait))
    async with asyncio.timeout(20):
        port = (await ports.get())["tcp"]
    return task, stop, port


async def _records(sink: MqttCollector, count: int) -> list[tuple[str, SegmentRecord]]:
    """Wait until the segments collected hold ``count`` records; return (lane, record) for each."""
    while True:
        out = [(m.topic.split("/")[3], r) for m in sink.messages for r in decode_segment(m.payload)]
        if len(out) >= count:
            return out
        await sink.wait_for(len(sink.messages) + 1)


async def test_partitioned_upstream_sends_each_session_on_its_own_lane_and_connection(tmp_path: Path) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    routes = {"up": "FROM /messages/* INTO $upstream"}
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": routes, "upstream": {"partitions": 2}}))
    store = open_store(data)
    await open_identities(store, "localhost", data_dir=data).set_password(Identity.parse("dev1"), b"pw")
    await store.close()
    sessions = ["ship-1", "ship-2", "ship-5", "ship-8"]
    assert {stable_partition(s, 2) for s in sessions} == {0, 1}
    async with (
        MosquittoPeer(tmp_path) as broker,
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
    ):
        upstream = MqttUpstreamSettings(host="127.0.0.1", port=broker.port, client_id="gw", hub_id="gw", linger_s=0.0)
        config = HubConfig(manifest=manifest, data_dir=data, mqtt_port=0, mqtts_port=None, upstream=upstream)
        task, stop, port = await _serve(config)
        device = Paho.make("dev1")
        assert await device.connect(port, user="dev1", password="pw") == 0
        for n in range(3):
            for s in sessions:
                device.publish(f"devices/dev1/messages/events/$.sid={s}&$.mid={s}-{n}", f"{s}:{n}".encode())
        async with asyncio.timeout(20):
            got = await _records(sink, 12)
        for s in sessions:
            lanes = {lane for lane, r in got if r.system_properties.get("sessionId") == s}
            assert lanes == {f"upstream-p{stable_partition(s, 2)}"}
            in_order = [r.body for lane, r in got if r.system_properties.get("sessionId") == s]
            assert in_order == [f"{s}:{n}".encode() for n in range(3)]
        log = (broker.workdir / "mosquitto.log").read_text(errors="replace")
        assert " as gw-p0 " in log
        assert " as gw-p1 " in log  # one MQTT session per lane
        await device.close()
        stop.set()
        async with asyncio.timeout(20):
            await task


async def test_what_the_single_lane_held_still_goes_out_after_partitions_are_turned_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    doc = {"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}
    manifest.write_text(json.dumps(doc))
    store = open_store(data)
    await open_identities(store, "localhost", data_dir=data).set_password(Identity.parse("dev1"), b"pw")
    await store.close()
    task, stop, port = await _serve(HubConfig(manifest=manifest, data_dir=data, mqtt_port=0, mqtts_port=None))
    device = Paho.make("dev1")
    assert await device.connect(port, user="dev1", password="pw") == 0
    for n in range(2):
        device.publish(f"devices/dev1/messages/events/$.mid=old-{n}", f"old {n}".encode())
    async with asyncio.timeout(10):
        assert [(await device.publishes.get())[1] for _ in range(2)] == [0, 0]  # stored on $upstream
    await device.close()
    stop.set()
    async with asyncio.timeout(20):
        await task

    async with (
        MosquittoPeer(tmp_path) as broker,
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
    ):
        upstream = MqttUpstreamSettings(host="127.0.0.1", port=broker.port, client_id="gw", hub_id="gw", linger_s=0.0)
        config = HubConfig(
            manifest=manifest, data_dir=data, mqtt_port=0, mqtts_port=None, upstream=upstream, partitions=2
        )
        task, stop, port = await _serve(config)
        device = Paho.make("dev1")
        assert await device.connect(port, user="dev1", password="pw") == 0
        device.publish("devices/dev1/messages/events/$.sid=ship-1", b"new")
        async with asyncio.timeout(20):
            got = await _records(sink, 3)
        assert sorted((lane, r.body) for lane, r in got) == [
            ("upstream", b"old 0"),
            ("upstream", b"old 1"),
            (f"upstream-p{stable_partition('ship-1', 2)}", b"new"),
        ]
        await device.close()
        stop.set()
        async with asyncio.timeout(20):
            await task
