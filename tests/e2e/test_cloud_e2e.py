"""The composition root serves the cloud's side of its MQTT upstream: with ``serve`` running against a real
Mosquitto as the cloud, a direct method the cloud invokes reaches a device on the hub and its answer comes back
to the cloud; a message the cloud sends for the device reaches it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from edgehub.core import Identity
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.serve import serve
from edgehub.runtime.compose.store import open_identities, open_store
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, WireMode
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


async def test_edgehub_run_relays_the_clouds_method_calls_and_device_bound_messages(tmp_path: Path) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}))
    store = open_store(data)
    await open_identities(store, "localhost", data_dir=data).set_password(Identity.parse("dev1"), b"pw")
    await store.close()
    async with MosquittoPeer(tmp_path) as broker:
        cloud = Paho.make("cloud")
        assert await cloud.connect(broker.port) == 0
        cloud.client.subscribe("$iothub/dev1/methods/res/#", qos=0)
        upstream = MqttUpstreamSettings(
            host="127.0.0.1", port=broker.port, client_id="gw", hub_id="gw", wire_mode=WireMode.MESSAGE
        )
        config = HubConfig(manifest=manifest, data_dir=data, mqtt_port=0, mqtts_port=None, upstream=upstream)
        stop = asyncio.Event()
        ports: asyncio.Queue[dict[str, int]] = asyncio.Queue()
        task = asyncio.create_task(serve(config, stop=stop, on_ready=ports.put_nowait))
        try:
            async with asyncio.timeout(20):
                await cloud.subscribes.get()
                port = (await ports.get())["tcp"]
            device = Paho.make("dev1")
            assert await device.connect(port, user="dev1", password="pw") == 0
            device.client.subscribe([("$iothub/methods/POST/#", 0), ("devices/dev1/messages/devicebound/#", 1)])
            async with asyncio.timeout(20):
                await device.subscribes.get()
                # The hub's upstream subscribes for dev1 once it is connected, which may come after the hub is
                # ready: each call unanswered within a second is made again (a call is never stored).
                for rid in range(1, 21):
                    cloud.publish(f"$iothub/dev1/methods/POST/ping/?$rid={rid}&$timeout=5", b"{}", qos=0)
                    try:
                        async with asyncio.timeout(1):
                            request = await device.messages.get()
                        break
                    except TimeoutError:
                        continue
                assert request.topic.startswith("$iothub/methods/POST/ping/?$rid=")
                device.publish(f"$iothub/methods/res/200/?$rid={request.topic.rpartition('=')[2]}", b'"pong"', qos=0)
                answer = await cloud.messages.get()
                assert answer.topic == f"$iothub/dev1/methods/res/200/?$rid={rid}"
                assert answer.payload == b'"pong"'
                cloud.publish("devices/dev1/messages/devicebound/$.mid=c1", b"hello device", qos=1)
                got = await device.messages.get()
            assert got.payload == b"hello device"
            assert got.topic.startswith("devices/dev1/messages/devicebound/")
            await device.close()
        finally:
            stop.set()
            async with asyncio.timeout(20):
                await task
            await cloud.close()
