"""``edgehub run --cleanup-interval SECS``: delivered messages leave the store within the interval, as a user
runs the hub, and not before the module has acknowledged them."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from edgehub.runtime.compose.store import open_store
from edgehub.store import QueueId, RemovalReason
from tests.e2e.hub_process import identity_add, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

TOKEN_EXPIRY = int(time.time()) + 86_400  # within the hub's maximum token lifetime (a year)
SINK = "/modules/sink/inputs/in1"


async def test_delivered_messages_are_removed_from_the_store_at_the_cleanup_interval(tmp_path: Path) -> None:
    data, manifest = tmp_path / "data", tmp_path / "manifest.json"
    route = f"FROM /messages/* WHERE $connectionDeviceId = 'dev1' INTO BrokeredEndpoint('{SINK}')"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"toSink": route}}))
    sink_cs = await identity_add(data, "edge", "--module", "sink")
    dev_cs = await identity_add(data, "dev1")
    proc, port, _ = await start(data, manifest, "--cleanup-interval", "0.3")
    ca = data / "certs" / "ca.pem"

    sink = Paho.make("edge/sink")
    sink.client.manual_ack_set(True)
    user = f"{sink_cs.host_name}/edge/sink/?api-version=2021-04-12"
    assert await sink.connect(port, tls_ca=ca, user=user, password=sink_cs.sas_token(TOKEN_EXPIRY)) == 0
    dev = Paho.make("dev1")
    user = f"{dev_cs.host_name}/dev1/?api-version=2021-04-12"
    assert await dev.connect(port, tls_ca=ca, user=user, password=dev_cs.sas_token(TOKEN_EXPIRY)) == 0
    got: list[mqtt.MQTTMessage] = []

    async def send_and_receive(count: int, ack: bool) -> None:
        for _ in range(count):
            mid = dev.publish("devices/dev1/messages/events/", json.dumps({"n": len(got)}).encode())
            async with asyncio.timeout(10):
                assert await dev.publishes.get() == (mid, 0)
            async with asyncio.timeout(10):
                got.append(await sink.messages.get())
            if ack:
                sink.client.ack(got[-1].mid, 1)

    await send_and_receive(6, ack=True)
    await send_and_receive(1, ack=False)  # this one stays unacknowledged (and holds back the next batch)
    await asyncio.sleep(1.5)  # several cleanup intervals
    await dev.close()
    await sink.close()
    assert (await stop(proc)).rstrip().endswith("stopped")

    store = open_store(data)
    try:
        (q,) = [q for q in store.queues() if q.endpoint == SINK]
        assert isinstance(q, QueueId)
        assert [r.offset for r in store.references(q, 0, 100)] == [6]  # the acknowledged ones are gone
        assert store.usage(SINK)[0] == 1
        assert store.usage()[0] == 1  # their bodies too
        assert store.removed[RemovalReason.DELIVERED] == 6
    finally:
        await store.close()
