"""The composition root with an upstream: a device's telemetry routed to ``$upstream`` reaches a real Mosquitto."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from edgehub.core import Identity
from edgehub.runtime.hub_runtime import HubConfig, open_identities, open_store, serve
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt_transport import MqttUpstreamSettings, WireMode
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


async def test_telemetry_routed_to_upstream_is_published_to_the_configured_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}))
    store = open_store(data)
    dev = Identity.parse("dev1")
    await open_identities(store, "localhost").set_password(dev, b"pw")
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
