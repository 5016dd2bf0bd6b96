"""Nested gateways, two ``edgehub run`` processes: a child hub's upstream is a device of its parent hub.

The child sends ``$upstream`` in wire mode ``message`` (one PUBLISH per message on the IoT Hub telemetry topic,
its property bag in the topic) over TLS to the parent's MQTT head, logged in as the device identity ``gw`` that
``edgehub identity add`` made on the parent, with a SAS token from its connection string. The parent routes
what arrives like any device's telemetry: here to a module that is connected to the parent."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from tests.e2e.hub_process import identity_add, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

TOKEN_EXPIRY = int(time.time()) + 86_400  # within the hub's maximum token lifetime (a year)
INPUT = "devices/edge/modules/sink/inputs/fromchild/"


async def test_a_message_sent_to_a_child_hub_is_routed_by_its_parent_with_its_properties(tmp_path: Path) -> None:
    parent, child = tmp_path / "parent", tmp_path / "child"
    parent_manifest, child_manifest = tmp_path / "parent.json", tmp_path / "child.json"
    parent_manifest.write_text(
        json.dumps(
            {
                "schemaVersion": "1.1",
                "routes": {
                    "fromChild": "FROM /messages/* WHERE $connectionDeviceId = 'gw' "
                    "INTO BrokeredEndpoint('/modules/sink/inputs/fromchild')"
                },
            }
        )
    )
    child_manifest.write_text(
        json.dumps(
            {
                "schemaVersion": "1.1",
                "routes": {"up": {"route": "FROM /messages/* INTO $upstream", "priority": 1}},
                "upstream": {"wireMode": "message", "lingerMs": 0},
            }
        )
    )
    gw_cs = await identity_add(parent, "gw")  # the child hub, as a device of the parent
    sink_cs = await identity_add(parent, "edge", "--module", "sink")
    dev_cs = await identity_add(child, "dev1")

    parent_proc, parent_port, _ = await start(parent, parent_manifest)
    ca = parent / "certs" / "ca.pem"  # the parent's CA, made at its first start
    child_proc, child_port, child_lines = await start(
        child,
        child_manifest,
        *["--upstream-mqtt", f"127.0.0.1:{parent_port}", "--upstream-client-id", "gw", "--upstream-ca-file", str(ca)],
        env={"EDGEHUB_UPSTREAM_SAS_TOKEN": gw_cs.sas_token(TOKEN_EXPIRY)},
    )
    [line] = [x for x in child_lines if x.startswith("upstream transport:")]
    assert f"mqtt 3.1.1 127.0.0.1:{parent_port} tls=on auth=sas token wire=message" in line

    sink = Paho.make("edge/sink")
    user = f"{sink_cs.host_name}/edge/sink/?api-version=2021-04-12"
    assert await sink.connect(parent_port, tls_ca=ca, user=user, password=sink_cs.sas_token(TOKEN_EXPIRY)) == 0
    dev = Paho.make("dev1")
    user = f"{dev_cs.host_name}/dev1/?api-version=2021-04-12"
    child_ca = child / "certs" / "ca.pem"
    assert await dev.connect(child_port, tls_ca=child_ca, user=user, password=dev_cs.sas_token(TOKEN_EXPIRY)) == 0
    for n in range(3):
        topic = f"devices/dev1/messages/events/$.mid=n{n}&$.ct=application%2Fjson&$.ce=utf-8&site=north%20yard&n={n}"
        mid = dev.publish(topic, json.dumps({"t": 20 + n}).encode())
        async with asyncio.timeout(10):
            assert await dev.publishes.get() == (mid, 0)

    got = []
    async with asyncio.timeout(30):
        for _ in range(3):
            got.append(await sink.messages.get())
    for n, msg in enumerate(got):  # in order, each once
        assert msg.topic.startswith(INPUT)
        assert msg.payload == json.dumps({"t": 20 + n}).encode()
        bag = dict(parse_qsl(msg.topic[len(INPUT) :]))
        assert bag["site"] == "north yard"
        assert bag["n"] == str(n)
        assert bag["$.mid"] == f"n{n}"
        assert bag["$.ct"] == "application/json"
        assert bag["$.ce"] == "utf-8"
        # The parent knows the sender by the connection: the child hub, not the device behind it.
        assert bag["$.cdid"] == "gw"
    await dev.close()
    await sink.close()
    assert (await stop(child_proc)).rstrip().endswith("stopped")

    # Why the child must use wire mode message: a batch-mode segment is a PUBLISH on edgehub/segments/..., which
    # is no telemetry topic, and the parent refuses it (MQTT 5: PUBACK "not authorized"; 3.1.1: it hangs up).
    user = f"{gw_cs.host_name}/gw/?api-version=2021-04-12"
    for protocol in (MQTTProtocolVersion.MQTTv5, MQTTProtocolVersion.MQTTv311):
        gw = Paho.make("gw", protocol=protocol)
        assert await gw.connect(parent_port, tls_ca=ca, user=user, password=gw_cs.sas_token(TOKEN_EXPIRY)) == 0
        mid = gw.publish("edgehub/segments/gw/upstream/p01", b"\x1f\x8b segment")
        async with asyncio.timeout(10):
            if protocol is MQTTProtocolVersion.MQTTv5:
                assert await gw.publishes.get() == (mid, 0x87)
            else:
                await gw.disconnects.get()
        await gw.close()
    assert (await stop(parent_proc)).rstrip().endswith("stopped")


# Every system property a device can set in its bag, with a value that survives URL-encoding both ways. Not the
# connection's ($.cdid, $.cmid: the parent sets them from its own connection) nor $.on (a device has no outputs).
EVERY_BAG_KEY = {
    "$.mid": "m-1",
    "$.cid": "c/1 2",
    "$.ct": "application/json",
    "$.ce": "utf-8",
    "$.to": "/devices/x/messages/devicebound",
    "$.uid": "u1",
    "$.exp": "2100-01-01T00:00:00Z",
    "$.schema": "telemetry;v=2",
    "$.ctime": "2026-11-25T12:00:00Z",
    "$.ifid": "urn:azureiot:Security:SecurityAgent:1",
    "$.sub": "thermostat1",
    "$.sid": "ship-7",
    "$.pk": "ship-7",
}


async def test_every_bag_key_crosses_from_a_child_hub_to_its_parent_in_wire_mode_message(tmp_path: Path) -> None:
    parent, child = tmp_path / "parent", tmp_path / "child"
    parent_manifest, child_manifest = tmp_path / "parent.json", tmp_path / "child.json"
    parent_manifest.write_text(
        json.dumps(
            {
                "schemaVersion": "1.1",
                "routes": {"r": "FROM /messages/* INTO BrokeredEndpoint('/modules/sink/inputs/fromchild')"},
            }
        )
    )
    child_manifest.write_text(
        json.dumps(
            {
                "schemaVersion": "1.1",
                "routes": {"up": "FROM /messages/* INTO $upstream"},
                "upstream": {"wireMode": "message"},
            }
        )
    )
    gw_cs = await identity_add(parent, "gw")
    sink_cs = await identity_add(parent, "edge", "--module", "sink")
    dev_cs = await identity_add(child, "dev1")
    parent_proc, parent_port, _ = await start(parent, parent_manifest)
    ca = parent / "certs" / "ca.pem"
    child_proc, child_port, _ = await start(
        child,
        child_manifest,
        *["--upstream-mqtt", f"127.0.0.1:{parent_port}", "--upstream-client-id", "gw", "--upstream-ca-file", str(ca)],
        env={"EDGEHUB_UPSTREAM_SAS_TOKEN": gw_cs.sas_token(TOKEN_EXPIRY)},
    )
    sink = Paho.make("edge/sink")
    user = f"{sink_cs.host_name}/edge/sink/?api-version=2021-04-12"
    assert await sink.connect(parent_port, tls_ca=ca, user=user, password=sink_cs.sas_token(TOKEN_EXPIRY)) == 0
    dev = Paho.make("dev1")
    user = f"{dev_cs.host_name}/dev1/?api-version=2021-04-12"
    assert (
        await dev.connect(
            child_port, tls_ca=child / "certs" / "ca.pem", user=user, password=dev_cs.sas_token(TOKEN_EXPIRY)
        )
        == 0
    )
    mid = dev.publish(f"devices/dev1/messages/events/{urlencode(EVERY_BAG_KEY, quote_via=quote)}&app=1", b"{}")
    async with asyncio.timeout(10):
        assert await dev.publishes.get() == (mid, 0)
    async with asyncio.timeout(30):
        got = await sink.messages.get()
    bag = dict(parse_qsl(got.topic[len(INPUT) :]))
    missing = {key: value for key, value in EVERY_BAG_KEY.items() if bag.get(key) != value}
    assert missing == {}, f"lost or changed on the way: {missing}; the parent saw {bag}"
    assert bag["app"] == "1"
    assert bag["$.cdid"] == "gw"
    await dev.close()
    await sink.close()
    assert (await stop(child_proc)).rstrip().endswith("stopped")
    assert (await stop(parent_proc)).rstrip().endswith("stopped")
