"""``edgehub run`` with its AMQP head, as users run it: AMQP and MQTT modules talk to each other through routes,
and a device's AMQP telemetry sent while the upstream is away survives a restart and lands once."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from proton import Message as AmqpMessage

from edgehub.core.sas import ConnectionString
from tests.e2e.hub_process import identity_add, start, stop
from tests.e2e.test_upload_run_e2e import landed
from tests.protocol_heads.amqp.conftest import ProtonClient, accept, receive
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

EXPIRY = int(time.time()) + 86_400


def amqps_port(lines: list[str]) -> int:
    for line in lines:
        m = re.search(r"amqps 127\.0\.0\.1:(\d+)", line)
        if m:
            return int(m.group(1))
    raise AssertionError(f"no amqps listener in {lines}")


async def amqp_client(port: int, data: Path, cs: ConnectionString) -> ProtonClient:
    who = cs.device_id if cs.module_id is None else f"{cs.device_id}/{cs.module_id}"
    return await ProtonClient.connect(
        port, ca=data / "certs" / "ca.pem", user=f"{who}@sas.{cs.host_name}", password=cs.sas_token(EXPIRY)
    )


async def test_amqp_and_mqtt_modules_receive_what_the_other_sent_to_its_output(tmp_path: Path) -> None:
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    routes = {
        "a2m": "FROM /messages/modules/amqpmod/outputs/out1 INTO BrokeredEndpoint('/modules/mqttmod/inputs/fromamqp')",
        "m2a": "FROM /messages/modules/mqttmod/outputs/out2 INTO BrokeredEndpoint('/modules/amqpmod/inputs/frommqtt')",
    }
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": routes}))
    amqp_cs = await identity_add(data, "edge", "--module", "amqpmod")
    mqtt_cs = await identity_add(data, "edge", "--module", "mqttmod")
    proc, port, lines = await start(data, manifest)
    ca = data / "certs" / "ca.pem"
    amqp = await amqp_client(amqps_port(lines), data, amqp_cs)
    mqtt = Paho.make("edge/mqttmod")
    user = f"{mqtt_cs.host_name}/edge/mqttmod/?api-version=2021-04-12"
    try:
        assert await mqtt.connect(port, tls_ca=ca, user=user, password=mqtt_cs.sas_token(EXPIRY)) == 0
        # AMQP output → MQTT input, with its properties.
        sender = await amqp.sender("/devices/edge/modules/amqpmod/messages/events")
        out = AmqpMessage(body=b'{"t": 1}', id="a-1", content_type="application/json")
        out.annotations = {"iothub-outputname": "out1"}
        out.properties = {"kind": "reading"}
        await amqp.send(sender, out)
        async with asyncio.timeout(10):
            got = await mqtt.messages.get()
        assert got.topic.startswith("devices/edge/modules/mqttmod/inputs/fromamqp/")
        assert got.payload == b'{"t": 1}'
        assert "kind=reading" in got.topic
        assert "%24.mid=a-1" in got.topic.replace("$", "%24")
        # MQTT output → AMQP input.
        receiver = await amqp.receiver("/devices/edge/modules/amqpmod/messages/events", credit=5)
        mid = mqtt.publish("devices/edge/modules/mqttmod/messages/events/$.on=out2&$.mid=m-1&kind=echo", b"back")
        async with asyncio.timeout(10):
            assert await mqtt.publishes.get() == (mid, 0)
        back = await receive(receiver)
        assert back.body == b"back"
        assert back.annotations["x-opt-input-name"] == "frommqtt"
        assert back.annotations["iothub-connection-module-id"] == "mqttmod"
        assert back.id == "m-1"
        assert back.properties == {"kind": "echo"}
        await accept(receiver)
    finally:
        await amqp.close()
        await mqtt.close()
        assert (await stop(proc)).rstrip().endswith("stopped")


async def test_amqp_telemetry_sent_while_upstream_is_away_lands_once_after_a_restart(tmp_path: Path) -> None:
    data, landing, manifest = tmp_path / "data", tmp_path / "landing", tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}))
    cs = await identity_add(data, "dev1")
    proc, _, lines = await start(data, manifest, "--no-upstream")  # $upstream stays queued
    client = await amqp_client(amqps_port(lines), data, cs)
    sender = await client.sender("/devices/dev1/messages/events")
    for n in range(20):
        message = AmqpMessage(body=f"reading {n}".encode(), id=f"m{n}", group_id="ship-7")
        await client.send(sender, message)  # returns once accepted: durable
    await client.close()
    assert (await stop(proc)).rstrip().endswith("stopped")

    proc, _, _ = await start(data, manifest, "--upstream-upload", landing.as_uri(), "--upstream-client-id", "gw")
    try:
        segments = await landed(landing, 20)
    finally:
        await stop(proc)
    records = [r for rs in segments.values() for r in rs]
    assert sorted(r.message_id or "" for r in records) == sorted(f"m{n}" for n in range(20))  # each once
    assert {r.system_properties["sessionId"] for r in records} == {"ship-7"}
    assert {r.device_id for r in records} == {"dev1"}
