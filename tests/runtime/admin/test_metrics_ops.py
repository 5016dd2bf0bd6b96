"""``/metrics`` of a running hub (real ``EdgeHub`` over RocksDB in tmp_path, MQTT head on 127.0.0.1, paho clients)
moves each per-operation metric by what a client did: scraped before and after, and the difference asserted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgehub.delivery import Endpoint
from edgehub.runtime.admin.client import AdminClient
from edgehub.runtime.admin.files import read_port, read_token
from edgehub.runtime.admin.metrics import AZURE_NAMES
from edgehub.runtime.admin.server import serve_admin
from edgehub.testing.linksim import LinkSim
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from tests.e2e.conftest import DEV, FILTER, SENSOR, Rig, running_hub, sas, username
from tests.protocol_heads.mqtt.conftest import Paho
from tests.store.fulldisk import fill, small_disk

__all__ = ["small_disk"]  # the fixture, imported for use here

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]  # paho clients and a Mosquitto upstream

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Scraper:
    rig: Rig
    client: AdminClient

    async def scrape(self) -> Samples:
        status, raw = await asyncio.to_thread(self.client.raw, "GET", "/metrics")
        assert status == 200
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(raw.decode())
            for s in family.samples
        }

    async def families(self) -> set[str]:
        status, raw = await asyncio.to_thread(self.client.raw, "GET", "/metrics")
        assert status == 200
        return {family.name for family in text_string_to_metric_families(raw.decode())}

    async def scrape_until(self, done: Callable[[Samples], bool]) -> Samples:
        """Scraped again until ``done(samples)`` (each scrape a real round trip); bounded by the caller."""
        while not done(samples := await self.scrape()):
            pass
        return samples


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


@asynccontextmanager
async def scraped_hub(tmp_path: Path, endpoints: Sequence[Endpoint] = ()) -> AsyncIterator[Scraper]:
    async with (
        running_hub(tmp_path, endpoints=endpoints) as rig,
        serve_admin(tmp_path, port=0, hub=rig.hub, server=rig.server),
    ):
        port, token = read_port(tmp_path), read_token(tmp_path)
        assert port is not None
        assert token is not None
        yield Scraper(rig, AdminClient(port, token, timeout_s=10.0))


@asynccontextmanager
async def device(rig: Rig) -> AsyncIterator[Paho]:
    dev = Paho.make(DEV.id)
    assert await dev.connect(rig.tcp, user=username(DEV), password=sas(DEV)) == 0
    try:
        yield dev
    finally:
        await dev.close()


async def test_a_twin_get_and_a_reported_patch_move_their_counters_and_summaries(tmp_path: Path) -> None:
    async with scraped_hub(tmp_path) as hub, device(hub.rig) as dev:
        dev.client.subscribe("$iothub/twin/res/#", qos=0)
        async with asyncio.timeout(10):
            await dev.subscribes.get()
        before = await hub.scrape()
        dev.publish("$iothub/twin/GET/?$rid=1", b"", qos=0)
        async with asyncio.timeout(10):
            twin = json.loads((await dev.messages.get()).payload)
        assert "reported" in twin
        dev.publish("$iothub/twin/PATCH/properties/reported/?$rid=2", b'{"temp": 21}', qos=0)
        dev.publish("$iothub/twin/PATCH/properties/reported/?$rid=3", b"[not json", qos=0)  # refused: a call too
        async with asyncio.timeout(10):
            topics = [(await dev.messages.get()).topic for _ in range(2)]
        assert topics == ["$iothub/twin/res/204/?$rid=2&$version=2", "$iothub/twin/res/400/?$rid=3"]
        after = await hub.scrape()
    ids = {"source": "edge", "id": DEV.id}
    assert moved(before, after, "edgehub_gettwin_total", **ids) == 1
    assert moved(before, after, "edgehub_gettwin_duration_seconds_count", **ids) == 1
    assert moved(before, after, "edgehub_gettwin_duration_seconds_sum", **ids) >= 0
    target = {"target": "edge", "id": DEV.id}
    assert moved(before, after, "edgehub_reported_properties_total", **target) == 2
    assert moved(before, after, "edgehub_reported_properties_update_duration_seconds_count", **target) == 2
    assert moved(before, after, "edgehub_reported_properties_update_duration_seconds_sum", **target) > 0


async def test_a_modules_method_call_to_a_device_moves_direct_methods_total_and_its_duration(tmp_path: Path) -> None:
    async with scraped_hub(tmp_path) as hub, device(hub.rig) as dev:
        module = Paho.make(SENSOR.id)
        assert await module.connect(hub.rig.tcp, user=username(SENSOR), password=sas(SENSOR)) == 0
        try:
            dev.client.subscribe("$iothub/methods/POST/#", qos=0)
            module.client.subscribe("$iothub/dev1/methods/res/#", qos=0)
            module.client.subscribe("$iothub/edge/nobody/methods/res/#", qos=0)
            async with asyncio.timeout(10):
                await dev.subscribes.get()
                await module.subscribes.get()
                await module.subscribes.get()
            before = await hub.scrape()
            module.publish("$iothub/dev1/methods/POST/reboot/?$rid=7", b"{}", qos=0)
            async with asyncio.timeout(10):
                request = await dev.messages.get()
                rid = request.topic.rsplit("$rid=", 1)[1]
                dev.publish(f"$iothub/methods/res/200/?$rid={rid}", b'{"ok": true}', qos=0)
                answer = await module.messages.get()
            assert answer.topic == "$iothub/dev1/methods/res/200/?$rid=7"
            module.publish("$iothub/edge/nobody/methods/POST/x/?$rid=8", b"{}", qos=0)  # 404: a call too
            async with asyncio.timeout(10):
                assert (await module.messages.get()).topic == "$iothub/edge/nobody/methods/res/404/?$rid=8"
            after = await hub.scrape()
        finally:
            await module.close()
    calls = {"from": SENSOR.id, "to": DEV.id}
    assert moved(before, after, "edgehub_direct_methods_total", **calls) == 1
    assert moved(before, after, "edgehub_direct_method_duration_seconds_count", **calls) == 1
    assert moved(before, after, "edgehub_direct_method_duration_seconds_sum", **calls) > 0
    assert moved(before, after, "edgehub_direct_methods_total", **{"from": SENSOR.id, "to": "edge/nobody"}) == 1


async def test_logins_move_connect_failed_by_reason_connect_success_and_disconnect(tmp_path: Path) -> None:
    async with scraped_hub(tmp_path) as hub:
        before = await hub.scrape()
        limit = hub.rig.server.settings.max_login_failures
        codes = []
        for _ in range(limit + 1):  # the last one is refused by the login throttle, before the credentials
            bad = Paho.make(DEV.id)
            codes.append(await bad.connect(hub.rig.tcp, user=username(DEV), password="not-a-token"))
            await bad.close()
        assert all(code != 0 for code in codes)
        module = Paho.make(SENSOR.id)
        assert await module.connect(hub.rig.tcp, user=username(SENSOR), password=sas(SENSOR)) == 0
        await module.close()
        key = ("edgehub_client_disconnect_total", (("id", SENSOR.id),))
        async with asyncio.timeout(10):
            after = await hub.scrape_until(lambda s: s.get(key, 0) - before.get(key, 0) == 1)
    assert moved(before, after, "edgehub_client_connect_failed_total", reason="bad_credentials") == limit
    assert moved(before, after, "edgehub_client_connect_failed_total", reason="login_throttled") == 1
    assert moved(before, after, "edgehub_client_connect_success_total", id=SENSOR.id) == 1
    assert moved(before, after, "edgehub_client_connect_success_total", id=DEV.id) == 0


async def test_messages_delivered_to_a_module_input_move_messages_sent_and_send_duration(tmp_path: Path) -> None:
    async with scraped_hub(tmp_path) as hub, device(hub.rig) as dev:
        before = await hub.scrape()
        for i in range(3):
            dev.publish("devices/dev1/messages/events/", f"m{i}".encode())
        module = Paho.make(FILTER.id)
        assert await module.connect(hub.rig.tcp, user=username(FILTER), password=sas(FILTER)) == 0
        try:
            module.client.subscribe("devices/edge/modules/filter/inputs/#", qos=1)
            async with asyncio.timeout(10):
                got = [(await module.messages.get()).payload for _ in range(3)]
                key = ("edgehub_messages_sent_total", (("to", "filter"), ("to_route_input", "in1")))
                after = await hub.scrape_until(lambda s: s.get(key, 0) - before.get(key, 0) == 3)
        finally:
            await module.close()
    assert sorted(got) == [b"m0", b"m1", b"m2"]
    to = {"to": "filter", "to_route_input": "in1"}
    assert moved(before, after, "edgehub_message_send_duration_seconds_count", **to) >= 1  # one per batch
    assert moved(before, after, "edgehub_message_send_duration_seconds_sum", **to) > 0


async def test_an_upstream_outage_moves_offline_count_and_offline_duration(tmp_path: Path, link: LinkSim) -> None:
    settings = MqttUpstreamSettings(
        host="127.0.0.1", port=link.port, client_id="gw", hub_id="gw", reconnect_min_s=0.1, reconnect_max_s=0.5
    )
    up = MqttUpstream(settings)
    await up.start()  # the executor closes it when the hub stops
    async with scraped_hub(tmp_path, endpoints=[up]) as hub:
        async with asyncio.timeout(10):
            await up.wait_connected()
        before = await hub.scrape()
        link.cut()
        async with asyncio.timeout(10):
            await up.wait_for(lambda: up.status().offline_count == 1)  # checked as the loss is counted
            during = await hub.scrape()
        link.restore()
        async with asyncio.timeout(10):
            await up.wait_connected()
        after = await hub.scrape()
        served = await hub.families()
    assert {name.removesuffix("_total") for name in AZURE_NAMES} <= served  # each listed name is served
    lane = {"lane": "$upstream"}
    assert moved(before, during, "edgehub_offline_count_total", **lane) == 1
    assert moved(before, during, "edgehub_offline_duration_seconds_count", **lane) == 0  # not over yet
    assert moved(before, after, "edgehub_offline_count_total", **lane) == 1
    assert moved(before, after, "edgehub_offline_duration_seconds_count", **lane) == 1
    assert moved(before, after, "edgehub_offline_duration_seconds_sum", **lane) > 0


async def test_messages_no_route_takes_move_messages_dropped_no_route(tmp_path: Path) -> None:
    async with scraped_hub(tmp_path) as hub:
        module = Paho.make(SENSOR.id)
        assert await module.connect(hub.rig.tcp, user=username(SENSOR), password=sas(SENSOR)) == 0
        try:
            before = await hub.scrape()
            # out1 has a route (to filter's input); out2 has none.
            topic = "devices/edge/modules/sensor/messages/events/$.on={}"
            mids = [module.publish(topic.format(out), b"x") for out in ("out2", "out2", "out2", "out1")]
            async with asyncio.timeout(10):
                acks = [await module.publishes.get() for _ in mids]
            after = await hub.scrape()
        finally:
            await module.close()
    assert sorted(acks) == sorted((mid, 0) for mid in mids)  # acknowledged all the same, as IoT Hub does
    assert moved(before, after, "edgehub_messages_dropped_total", reason="no_route") == 3
    assert moved(before, after, "edgehub_messages_received_total", id=SENSOR.id) == 1


async def test_a_message_ingest_refuses_moves_messages_refused_by_its_reason(tmp_path: Path) -> None:
    async with scraped_hub(tmp_path) as hub, device(hub.rig) as dev:
        before = await hub.scrape()
        dev.publish("devices/dev1/messages/events/$.sid=a&$.pk=b", b"x")  # sessionId and partitionKey differ
        async with asyncio.timeout(10):
            await dev.disconnects.get()  # MQTT 3.1.1: a refused message closes the connection
        after = await hub.scrape()
    assert moved(before, after, "edgehub_messages_refused_total", reason="partition_key_mismatch") == 1
    assert moved(before, after, "edgehub_messages_received_total", id=DEV.id) == 0


async def test_a_group_the_full_disk_refuses_moves_messages_unack_storage_failure(small_disk: Path) -> None:
    async with scraped_hub(small_disk) as hub, device(hub.rig) as dev:
        before = await hub.scrape()
        fill(small_disk / "filler")
        try:
            mid = dev.publish("devices/dev1/messages/events/", b"x" * 100_000)
            async with asyncio.timeout(10):
                await dev.disconnects.get()  # MQTT 3.1.1: a refused message closes the connection, unacknowledged
        finally:
            (small_disk / "filler").unlink()
        after = await hub.scrape()
    assert mid > 0
    assert moved(before, after, "edgehub_messages_unack_total", reason="storage_failure") == 1
    assert moved(before, after, "edgehub_messages_received_total", id=DEV.id) == 0
