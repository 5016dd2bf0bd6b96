"""The cloud's side through two ``edgehub run`` processes: Mosquitto stands in for the cloud, the parent hub's
upstream is connected to it, and a child hub's upstream logs in to the parent as device ``gw`` (over TLS, with a
SAS token). ``dev-x`` is on the child, and the parent knows it is behind ``gw`` (``edgehub identity add dev-x
--parent gw``). A method the cloud invokes on ``dev-x`` goes cloud → parent → child → device and its answer comes
back the same way; a cloud-to-device message for ``dev-x`` reaches the device."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from edgehub.testing.peers import MosquittoPeer
from tests.e2e.hub_process import identity_add, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

TOKEN_EXPIRY = int(time.time()) + 86_400


async def test_the_clouds_calls_and_messages_reach_a_device_behind_a_child_hub(tmp_path: Path) -> None:
    parent, child = tmp_path / "parent", tmp_path / "child"
    manifest = tmp_path / "manifest.json"
    routes = {"up": "FROM /messages/* INTO $upstream"}
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": routes, "upstream": {"wireMode": "message"}}))
    gw_cs = await identity_add(parent, "gw")
    await identity_add(parent, "dev-x", "--parent", "gw")
    dev_cs = await identity_add(child, "dev-x")
    async with MosquittoPeer(tmp_path / "cloud") as broker:
        cloud = Paho.make("cloud")
        assert await cloud.connect(broker.port) == 0
        cloud.client.subscribe("$iothub/dev-x/methods/res/#", qos=0)
        parent_proc, parent_port, _ = await start(
            parent, manifest, "--upstream-mqtt", f"127.0.0.1:{broker.port}", "--upstream-client-id", "parent-hub"
        )
        child_proc, child_port, _ = await start(
            child,
            manifest,
            *["--upstream-mqtt", f"127.0.0.1:{parent_port}", "--upstream-client-id", "gw"],
            *["--upstream-ca-file", str(parent / "certs" / "ca.pem")],
            env={"EDGEHUB_UPSTREAM_SAS_TOKEN": gw_cs.sas_token(TOKEN_EXPIRY)},
        )
        dev = Paho.make("dev-x")
        user = f"{dev_cs.host_name}/dev-x/?api-version=2021-04-12"
        ca = child / "certs" / "ca.pem"
        assert await dev.connect(child_port, tls_ca=ca, user=user, password=dev_cs.sas_token(TOKEN_EXPIRY)) == 0
        dev.client.subscribe([("$iothub/methods/POST/#", 0), ("devices/dev-x/messages/devicebound/#", 1)])
        async with asyncio.timeout(60):
            await cloud.subscribes.get()
            await dev.subscribes.get()
            # The two upstreams subscribe once connected, which may come after the hubs are ready: a call not
            # answered within a second is made again (calls are never stored, so none of them lingers).
            for rid in range(1, 41):
                cloud.publish(f"$iothub/dev-x/methods/POST/ping/?$rid={rid}&$timeout=5", b'{"n": 1}', qos=0)
                try:
                    async with asyncio.timeout(1):
                        request = await dev.messages.get()
                    break
                except TimeoutError:
                    continue
            assert request.topic.startswith("$iothub/methods/POST/ping/?$rid=")
            assert request.payload == b'{"n": 1}'
            dev.publish(f"$iothub/methods/res/200/?$rid={request.topic.rpartition('=')[2]}", b'"pong"', qos=0)
            answer = await cloud.messages.get()
            assert answer.topic == f"$iothub/dev-x/methods/res/200/?$rid={rid}"
            assert answer.payload == b'"pong"'
            cloud.publish("devices/dev-x/messages/devicebound/$.mid=deep-1&k=v", b"through two hubs", qos=1)
            got = await dev.messages.get()
        assert got.payload == b"through two hubs"
        assert got.topic.startswith("devices/dev-x/messages/devicebound/")
        assert "$.mid=deep-1" in got.topic
        await dev.close()
        await cloud.close()
        assert (await stop(child_proc)).rstrip().endswith("stopped")
        assert (await stop(parent_proc)).rstrip().endswith("stopped")
