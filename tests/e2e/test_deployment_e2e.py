"""Issue 17 as it is judged: ``edgehub run --manifest M`` as a process, steered while devices and modules stay
connected, by editing M and by desired-property patches from a Mosquitto standing in for the cloud (IoT Hub's
twin topics over the upstream connection); the reported properties come back over the same connection."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from edgehub.core.sas import ConnectionString
from edgehub.runtime.admin.client import running_hub
from edgehub.testing.cloud_twin import CloudTwinService
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from tests.e2e.hub_process import identity_add, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

TOKEN_EXPIRY = int(time.time()) + 86_400
REPORTED = "$iothub/twin/PATCH/properties/reported/#"
DESIRED = "$iothub/twin/PATCH/properties/desired/?$version={}"
INPUTS = "devices/edge/modules/sink/inputs/"


def to_sink(kind: str, input_name: str) -> str:
    return f"FROM /messages/* WHERE kind = '{kind}' INTO BrokeredEndpoint(\"/modules/sink/inputs/{input_name}\")"


def write_manifest(path: Path, version: int, routes: dict[str, Any], **more: Any) -> None:
    desired = {"schemaVersion": "1.1", "$version": version, "routes": routes, **more}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"modulesContent": {"$edgeHub": {"properties.desired": desired}}}))
    os.replace(tmp, path)  # the watcher never reads half a file


async def reported_version(cloud: MqttCollector, version: int) -> dict[str, Any]:
    """The first reported properties (from the start of the collection) whose lastDesiredVersion is ``version``."""
    seen = 0
    while True:
        for m in cloud.messages[seen:]:
            doc = json.loads(m.payload)
            if doc.get("lastDesiredVersion") == version:
                return dict(doc)
        seen = len(cloud.messages)
        await cloud.wait_for(seen + 1)


@asynccontextmanager
async def hub_steered_from_a_cloud(
    tmp_path: Path, data: Path, manifest: Path
) -> AsyncIterator[tuple[int, MosquittoPeer, MqttCollector]]:
    """``edgehub run`` with its upstream on a Mosquitto standing in for the cloud, and a collector of the reported
    properties it sends there; yields once the first (the manifest's version 1) was reported applied."""
    async with (
        MosquittoPeer(tmp_path) as broker,
        MqttCollector(host=broker.host, port=broker.port, topic=REPORTED, client_id="cloud-twin") as cloud,
    ):
        proc, port, _ = await start(
            data, manifest, "--upstream-mqtt", f"127.0.0.1:{broker.port}", "--upstream-client-id", "gw"
        )
        try:
            assert (await reported_version(cloud, 1))["lastDesiredStatus"]["code"] == 200
            yield port, broker, cloud
        finally:
            assert (await stop(proc)).rstrip().endswith("stopped")


async def connect(cs: ConnectionString, client_id: str, port: int, ca: Path, **kw: Any) -> Paho:
    client = Paho.make(client_id, **kw)
    user = f"{cs.host_name}/{client_id}/?api-version=2021-04-12"
    assert await client.connect(port, tls_ca=ca, user=user, password=cs.sas_token(TOKEN_EXPIRY)) == 0
    return client


async def send(dev: Paho, kind: str, n: int, **props: str) -> int:
    """Publish one message with ``kind`` (QoS 1); its PUBACK's reason code."""
    bag = "&".join([f"kind={kind}", f"n={n}", *(f"{k}={v}" for k, v in props.items())])
    mid = dev.publish(f"devices/dev1/messages/events/{bag}", f"{kind}{n}".encode())
    async with asyncio.timeout(10):
        got_mid, code = await dev.publishes.get()
    assert got_mid == mid
    return code


async def received_on(sink: Paho) -> str:
    async with asyncio.timeout(15):
        msg = await sink.messages.get()
    return str(msg.topic[len(INPUTS) :].split("/")[0])


async def test_file_edits_and_cloud_patches_apply_live_and_a_bad_update_is_refused_while_traffic_flows(
    tmp_path: Path,
) -> None:
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    write_manifest(manifest, 1, {"a": to_sink("a", "first")})
    dev_cs = await identity_add(data, "dev1")
    sink_cs = await identity_add(data, "edge", "--module", "sink")
    idle_cs = await identity_add(data, "edge", "--module", "idle")
    ca = data / "certs" / "ca.pem"
    async with hub_steered_from_a_cloud(tmp_path, data, manifest) as (port, broker, cloud):
        sink = await connect(sink_cs, "edge/sink", port, ca)
        dev = await connect(dev_cs, "dev1", port, ca, protocol=MQTTProtocolVersion.MQTTv5)
        assert await send(dev, "a", 1) == 0
        assert await received_on(sink) == "first"

        # 1. The file is edited: the route now goes to another input; the same connections carry it.
        write_manifest(manifest, 2, {"a": to_sink("a", "second")})
        assert (await reported_version(cloud, 2))["lastDesiredStatus"]["code"] == 200
        assert await send(dev, "a", 2) == 0
        assert await received_on(sink) == "second"

        # 2. A desired patch from the cloud adds a route.
        cloud_client = Paho.make("cloud-admin")
        assert await cloud_client.connect(broker.port) == 0
        patch = {"routes": {"c": to_sink("c", "third")}}
        cloud_client.publish(DESIRED.format(3), json.dumps(patch).encode())
        assert (await reported_version(cloud, 3))["lastDesiredStatus"]["code"] == 200
        assert await send(dev, "c", 3) == 0
        assert await received_on(sink) == "third"

        # 3. A bad patch is refused with every error; traffic keeps flowing under the running routes.
        bad = {"routes": {"a": "FROM /messages/* INTO $nowhere"}, "delivery": {"maxDeliveryAtempts": 3}}
        cloud_client.publish(DESIRED.format(4), json.dumps(bad).encode())
        refused = await reported_version(cloud, 4)
        assert refused["lastDesiredStatus"]["code"] == 400
        errors = refused["lastDesiredStatus"]["errors"]
        assert "delivery.maxDeliveryAtempts: unknown key" in errors
        assert any(e.startswith("routes.a: unknown sink '$nowhere'") for e in errors)
        assert refused["runningDesiredVersion"] == 3
        assert await send(dev, "a", 4) == 0
        assert await received_on(sink) == "second"

        # 4. A queue quota from the next update meets a device that fills the queue: MQTT 5 gets 0x97.
        quota = {"queuePolicy": {"maxQueueMessages": 2, "overflow": "rejectIncoming", "enqueueTimeoutSecs": 0}}
        update = {
            "routes": {"q": "FROM /messages/* WHERE kind = 'q' INTO BrokeredEndpoint(\"/modules/idle/inputs/x\")"},
            "endpoints": {"/modules/idle/inputs/x": quota},
        }
        cloud_client.publish(DESIRED.format(5), json.dumps(update).encode())
        assert (await reported_version(cloud, 5))["lastDesiredStatus"]["code"] == 200
        assert [await send(dev, "q", n) for n in range(3)] == [0, 0, 0x97]

        # 5. discardOldest: the oldest of the lowest priority goes first.
        update = {
            "routes": {
                "q": None,
                "qlo": {
                    "route": "FROM /messages/* WHERE kind = 'lo' INTO BrokeredEndpoint(\"/modules/idle/inputs/y\")",
                    "priority": 5,
                },
                "qhi": {
                    "route": "FROM /messages/* WHERE kind = 'hi' INTO BrokeredEndpoint(\"/modules/idle/inputs/y\")",
                    "priority": 0,
                },
            },
            "endpoints": {
                "/modules/idle/inputs/y": {
                    "queuePolicy": {"maxQueueMessages": 3, "overflow": "discardOldest", "enqueueTimeoutSecs": 0}
                }
            },
        }
        cloud_client.publish(DESIRED.format(6), json.dumps(update).encode())
        assert (await reported_version(cloud, 6))["lastDesiredStatus"]["code"] == 200
        for kind, n in (("lo", 1), ("hi", 1), ("lo", 2), ("hi", 2)):
            assert await send(dev, kind, n) == 0
        cloud_client.publish(DESIRED.format(7), json.dumps({"routes": {"qlo": None}}).encode())
        queues = (await reported_version(cloud, 7))["queues"]
        held = {q["priority"]: q["length"] for q in queues if q["endpoint"] == "/modules/idle/inputs/y"}
        assert held == {0: 2, 5: 1}
        idle = await connect(idle_cs, "edge/idle", port, ca)
        got: list[bytes] = []
        async with asyncio.timeout(15):
            while len(got) < 3:
                msg = await idle.messages.get()
                if msg.topic.startswith("devices/edge/modules/idle/inputs/y/"):
                    got.append(bytes(msg.payload))
        assert got == [b"hi1", b"hi2", b"lo2"]  # lo1, the oldest of the lowest priority, made room
        await idle.close()
        assert not dev.gone
        assert not sink.gone
        await cloud_client.close()
        await dev.close()
        await sink.close()


async def test_module_twins_come_from_the_manifest_changes_are_pushed_and_reported_patches_notify_routes(
    tmp_path: Path,
) -> None:
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    notify = 'FROM /twinChangeNotifications INTO BrokeredEndpoint("/modules/sink/inputs/twins")'

    def deployment(version: int, filter_desired: dict[str, Any]) -> None:
        content = {
            "$edgeHub": {"properties.desired": {"schemaVersion": "1.1", "$version": version, "routes": {"n": notify}}},
            "filter": {"properties.desired": filter_desired},
        }
        tmp = manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps({"modulesContent": content}))
        os.replace(tmp, manifest)

    deployment(1, {"threshold": 25, "window": {"seconds": 10, "function": "mean"}})
    filter_cs = await identity_add(data, "edge", "--module", "filter")
    sink_cs = await identity_add(data, "edge", "--module", "sink")
    proc, port, _ = await start(data, manifest)
    ca = data / "certs" / "ca.pem"
    try:
        module = await connect(filter_cs, "edge/filter", port, ca)
        sink = await connect(sink_cs, "edge/sink", port, ca)
        module.client.subscribe("$iothub/twin/res/#", qos=0)
        module.client.subscribe("$iothub/twin/PATCH/properties/desired/#", qos=0)
        async with asyncio.timeout(10):
            await module.subscribes.get()
            await module.subscribes.get()
        module.publish("$iothub/twin/GET/?$rid=1", b"", qos=0)
        async with asyncio.timeout(10):
            got = await module.messages.get()
        assert got.topic == "$iothub/twin/res/200/?$rid=1"
        twin = json.loads(got.payload)
        assert twin["desired"] == {"threshold": 25, "window": {"seconds": 10, "function": "mean"}, "$version": 1}

        deployment(2, {"threshold": 30, "window": {"seconds": 10}})
        async with asyncio.timeout(15):
            pushed = await module.messages.get()
        assert pushed.topic == "$iothub/twin/PATCH/properties/desired/?$version=2"
        assert json.loads(pushed.payload) == {"threshold": 30, "window": {"function": None}, "$version": 2}

        module.publish("$iothub/twin/PATCH/properties/reported/?$rid=2", b'{"applied": 30}', qos=0)
        async with asyncio.timeout(10):
            answer = await module.messages.get()
        assert answer.topic.startswith("$iothub/twin/res/204/?$rid=2")
        async with asyncio.timeout(15):
            note = await sink.messages.get()
        assert note.topic.startswith("devices/edge/modules/sink/inputs/twins/")
        assert json.loads(note.payload) == {"version": 2, "properties": {"reported": {"applied": 30}}}
        await module.close()
        await sink.close()
    finally:
        assert (await stop(proc)).rstrip().endswith("stopped")

    # After a restart the module's twin is what it was: the deployment's desired, its own reported.
    proc, port, _ = await start(data, manifest)
    try:
        module = await connect(filter_cs, "edge/filter", port, ca)
        module.client.subscribe("$iothub/twin/res/#", qos=0)
        async with asyncio.timeout(10):
            await module.subscribes.get()
        module.publish("$iothub/twin/GET/?$rid=3", b"", qos=0)
        async with asyncio.timeout(10):
            twin = json.loads((await module.messages.get()).payload)
        assert twin["desired"] == {"threshold": 30, "window": {"seconds": 10}, "$version": 2}
        assert twin["reported"]["applied"] == 30
        await module.close()
    finally:
        assert (await stop(proc)).rstrip().endswith("stopped")


async def test_grants_from_mqtt_broker_take_effect_on_a_running_connection_at_its_next_publish(tmp_path: Path) -> None:
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    grant = {
        "authorizations": [
            {
                "identities": ["{{iot:identity}}"],
                "allow": [{"operations": ["mqtt:publish"], "resources": ["local/{{iot:device_id}}/#"]}],
            }
        ]
    }
    routes = {"up": "FROM /messages/* INTO $upstream"}
    write_manifest(manifest, 1, routes, schemaVersion="1.2", mqttBroker=grant)
    dev_cs = await identity_add(data, "dev1")
    ca = data / "certs" / "ca.pem"
    async with hub_steered_from_a_cloud(tmp_path, data, manifest) as (port, _broker, cloud):
        dev = await connect(dev_cs, "dev1", port, ca, protocol=MQTTProtocolVersion.MQTTv5)

        async def publish(topic: str) -> int:
            mid = dev.publish(topic, b"x")
            async with asyncio.timeout(10):
                got_mid, code = await dev.publishes.get()
            assert got_mid == mid
            return code

        assert await publish("local/dev1/temp") == 0
        assert await publish("local/dev1/temp") == 0  # a topic used before: still checked
        assert await publish("local/dev2/temp") == 0x87
        write_manifest(manifest, 2, routes, schemaVersion="1.2")  # the grant withdrawn
        await reported_version(cloud, 2)
        assert await publish("local/dev1/temp") == 0x87
        assert not dev.gone
        await dev.close()


async def test_puts_and_patches_through_the_admin_api_apply_live_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    """The third way in (issue 17): the local admin API of a running ``edgehub run``, with the clients connected."""
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    write_manifest(manifest, 1, {"a": to_sink("a", "first")})
    dev_cs = await identity_add(data, "dev1")
    sink_cs = await identity_add(data, "edge", "--module", "sink")
    ca = data / "certs" / "ca.pem"
    proc, port, _ = await start(data, manifest)
    try:
        client = await asyncio.to_thread(running_hub, data)
        assert client is not None
        sink = await connect(sink_cs, "edge/sink", port, ca)
        dev = await connect(dev_cs, "dev1", port, ca, protocol=MQTTProtocolVersion.MQTTv5)
        assert await send(dev, "a", 1) == 0
        assert await received_on(sink) == "first"

        # PATCH: a JSON merge patch adds a route; the same connections carry its messages.
        patch = {"$version": 2, "routes": {"b": to_sink("b", "second")}}
        code, answer = await asyncio.to_thread(client.request, "PATCH", "/twin/desired", patch)
        assert (code, answer["code"], answer["version"]) == (200, 200, 2)  # type: ignore[index]
        assert await send(dev, "b", 2) == 0
        assert await received_on(sink) == "second"

        # PUT: the whole desired properties replace the running ones (route b is gone, a goes elsewhere).
        whole = {"schemaVersion": "1.1", "$version": 3, "routes": {"a": to_sink("a", "third")}}
        code, answer = await asyncio.to_thread(client.request, "PUT", "/twin/desired", whole)
        assert (code, answer["code"]) == (200, 200)  # type: ignore[index]
        assert await send(dev, "a", 3) == 0
        assert await received_on(sink) == "third"

        # A bad PUT is a 400 with each error and its location; the running routes stay.
        bad = {"schemaVersion": "1.1", "$version": 4, "routes": {"a": to_sink("a", "x")}, "storeAndForward": {}}
        code, answer = await asyncio.to_thread(client.request, "PUT", "/twin/desired", bad, ok=(400,))
        assert code == 400
        assert any("storeAndForward" in e for e in answer["errors"])  # type: ignore[index]
        _, reported = await asyncio.to_thread(client.request, "GET", "/twin/reported")
        assert reported["lastDesiredVersion"] == 4  # type: ignore[index]
        assert reported["lastDesiredStatus"]["code"] == 400  # type: ignore[index]
        assert reported["runningDesiredVersion"] == 3  # type: ignore[index]
        assert await send(dev, "a", 4) == 0
        assert await received_on(sink) == "third"
        await dev.close()
        await sink.close()
    finally:
        assert (await stop(proc)).rstrip().endswith("stopped")


async def test_a_cloud_patch_sent_while_the_upstream_was_down_is_applied_from_the_twin_fetched_on_reconnect(
    tmp_path: Path,
) -> None:
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    write_manifest(manifest, 1, {"a": to_sink("a", "first")})
    dev_cs = await identity_add(data, "dev1")
    sink_cs = await identity_add(data, "edge", "--module", "sink")
    ca = data / "certs" / "ca.pem"
    twin = {"schemaVersion": "1.1", "routes": {"a": to_sink("a", "first")}}
    async with (
        MosquittoPeer(tmp_path) as broker,
        LinkSim(target_host=broker.host, target_port=broker.port) as link,
        CloudTwinService(host=broker.host, port=broker.port, desired=twin) as cloud,
    ):
        proc, port, _ = await start(
            data, manifest, "--upstream-mqtt", f"127.0.0.1:{link.port}", "--upstream-client-id", "gw"
        )
        try:
            async with asyncio.timeout(60):
                await cloud.wait_for(lambda: cloud.reported.get("lastDesiredVersion") == 1)
                sink = await connect(sink_cs, "edge/sink", port, ca)
                dev = await connect(dev_cs, "dev1", port, ca, protocol=MQTTProtocolVersion.MQTTv5)
                link.cut()  # the hub's upstream is down while the cloud changes the desired properties
                version = cloud.patch({"routes": {"a": to_sink("a", "second")}})
                link.restore()
                await cloud.wait_for(lambda: cloud.reported.get("lastDesiredVersion") == version)
                assert cloud.reported["lastDesiredStatus"]["code"] == 200
                assert cloud.reported["source"] == "cloud"
                assert await send(dev, "a", 1) == 0
                assert await received_on(sink) == "second"
                assert not dev.gone
                assert not sink.gone
                await dev.close()
                await sink.close()
        finally:
            assert (await stop(proc)).rstrip().endswith("stopped")
