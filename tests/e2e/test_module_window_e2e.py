"""``edgehub run --module-window N``: at most N deliveries in flight to a module, as a user starts the hub; the
manifest's ``delivery.moduleDeliveryWindow`` over it, live."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from edgehub.core.sas import ConnectionString
from edgehub.runtime.admin.client import running_hub
from tests.e2e.hub_process import identity_add, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

TOKEN_EXPIRY = int(time.time()) + 86_400  # within the hub's maximum token lifetime (a year)


async def queued_while_the_module_is_away(port: int, ca: Path, dev_cs: ConnectionString, count: int) -> Paho:
    """dev1, connected, has sent ``count`` messages routed to the module: the executor hands its link one batch."""
    dev = Paho.make("dev1")
    user = f"{dev_cs.host_name}/dev1/?api-version=2021-04-12"
    assert await dev.connect(port, tls_ca=ca, user=user, password=dev_cs.sas_token(TOKEN_EXPIRY)) == 0
    for n in range(count):
        mid = dev.publish("devices/dev1/messages/events/", json.dumps({"n": n}).encode())
        async with asyncio.timeout(10):
            assert await dev.publishes.get() == (mid, 0)
    return dev


async def three_in_flight_after_the_probe(
    port: int, ca: Path, sink_cs: ConnectionString
) -> tuple[Paho, list[mqtt.MQTTMessage]]:
    """The module, acking only when the test says so, connects: the executor probes with one message, whose ack
    reopens the queue; then a window of three arrives and no fourth. The module and the four it got."""
    sink = Paho.make("edge/sink")
    sink.client.manual_ack_set(True)  # unacknowledged until the test says so
    user = f"{sink_cs.host_name}/edge/sink/?api-version=2021-04-12"
    assert await sink.connect(port, tls_ca=ca, user=user, password=sink_cs.sas_token(TOKEN_EXPIRY)) == 0
    async with asyncio.timeout(10):
        probe = await sink.messages.get()
    sink.client.ack(probe.mid, 1)
    got = [probe]
    async with asyncio.timeout(10):
        for _ in range(3):
            got.append(await sink.messages.get())
    await asyncio.sleep(1.0)  # time for a fourth to arrive, were the window wider
    assert sink.messages.empty()
    return sink, got


async def test_a_module_never_has_more_unacknowledged_deliveries_than_the_window(tmp_path: Path) -> None:
    data, manifest = tmp_path / "data", tmp_path / "manifest.json"
    route = "FROM /messages/* WHERE $connectionDeviceId = 'dev1' INTO BrokeredEndpoint('/modules/sink/inputs/in1')"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"toSink": route}}))
    sink_cs = await identity_add(data, "edge", "--module", "sink")
    dev_cs = await identity_add(data, "dev1")
    proc, port, _ = await start(data, manifest, "--module-window", "3")
    ca = data / "certs" / "ca.pem"

    dev = await queued_while_the_module_is_away(port, ca, dev_cs, 8)
    sink, got = await three_in_flight_after_the_probe(port, ca, sink_cs)

    # Each ack frees one place: the rest follow in order, never more than three unacknowledged.
    while len(got) < 8:
        sink.client.ack(got[len(got) - 3].mid, 1)  # the oldest unacknowledged
        async with asyncio.timeout(10):
            got.append(await sink.messages.get())
        await asyncio.sleep(0.1)
        assert sink.messages.empty()
    assert [json.loads(m.payload)["n"] for m in got] == list(range(8))
    for m in got[-3:]:
        sink.client.ack(m.mid, 1)
    await dev.close()
    await sink.close()
    assert (await stop(proc)).rstrip().endswith("stopped")


async def test_the_manifests_window_from_the_admin_api_applies_live_over_the_flags(tmp_path: Path) -> None:
    data, manifest = tmp_path / "data", tmp_path / "manifest.json"
    route = "FROM /messages/* WHERE $connectionDeviceId = 'dev1' INTO BrokeredEndpoint('/modules/sink/inputs/in1')"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"toSink": route}}))
    sink_cs = await identity_add(data, "edge", "--module", "sink")
    dev_cs = await identity_add(data, "dev1")
    proc, port, _ = await start(data, manifest, "--module-window", "3", "--admin-port", "0")
    ca = data / "certs" / "ca.pem"
    try:
        dev = await queued_while_the_module_is_away(port, ca, dev_cs, 10)
        sink, got = await three_in_flight_after_the_probe(port, ca, sink_cs)

        # The deployment's window, over the flag's, from the admin API: three more go out with no ack to wait for.
        client = await asyncio.to_thread(running_hub, data)
        assert client is not None
        patch = {"delivery": {"moduleDeliveryWindow": 6}}
        code, _ = await asyncio.to_thread(client.request, "PATCH", "/twin/desired", patch)
        assert code == 200
        async with asyncio.timeout(10):
            for _ in range(3):
                got.append(await sink.messages.get())
        await asyncio.sleep(1.0)  # time for a seventh to arrive, were the window wider still
        assert sink.messages.empty()
        _, reported = await asyncio.to_thread(client.request, "GET", "/twin/reported")
        assert isinstance(reported, dict)
        assert (reported["running"]["moduleDeliveryWindow"], reported["restartRequired"]) == (6, [])
        for m in got[1:]:
            sink.client.ack(m.mid, 1)
        async with asyncio.timeout(10):
            while len(got) < 10:
                got.append(await sink.messages.get())
        assert [json.loads(m.payload)["n"] for m in got] == list(range(10))
        for m in got[7:]:
            sink.client.ack(m.mid, 1)
        await dev.close()
        await sink.close()
    finally:
        assert (await stop(proc)).rstrip().endswith("stopped")
