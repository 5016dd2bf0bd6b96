"""The upstream through the whole hub when the link is not there: paho devices into the MQTT head, the RocksDB
store in tmp_path, the executor, and the MQTT upstream transport through the link simulator to a real Mosquitto.

Offline then online: everything queued arrives, highest priority first; what expired offline never goes; a hub
restarted while offline still sends what it acknowledged; a link that dies silently (no acks, no FIN) loses
nothing from the store before its PUBACK."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.routing import RouteSpec
from edgehub.store import QueueId, RemovalReason
from edgehub.testing import ManualClock
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.segment import decode_segment
from tests.e2e.conftest import DEV, Rig, running_hub, sas, username
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

ROUTES: dict[str, str | RouteSpec] = {
    "alerts": RouteSpec(route="FROM /messages/* WHERE kind = 'alert' INTO $upstream", priority=0),
    "short": RouteSpec(route="FROM /messages/* WHERE kind = 'short' INTO $upstream", priority=3, time_to_live_secs=30),
    "telemetry": RouteSpec(route="FROM /messages/* WHERE kind = 'tele' INTO $upstream", priority=5),
}
P5 = QueueId("$upstream", 5)


@pytest.fixture
async def cloud(broker: MosquittoPeer) -> AsyncIterator[MqttCollector]:
    async with MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink:
        yield sink


async def upstream(link: LinkSim) -> MqttUpstream:
    up = MqttUpstream(
        MqttUpstreamSettings(
            host="127.0.0.1",
            port=link.port,
            client_id="gw",
            hub_id="gw",
            keepalive_s=1,
            ack_timeout_s=1.5,
            connect_timeout_s=1.0,
            reconnect_min_s=0.1,
            reconnect_max_s=0.5,
        )
    )
    await up.start()  # the executor closes it when the hub stops
    return up


async def publish(dev: Paho, *messages: tuple[str, str]) -> None:
    """Publish (kind, id) messages with QoS 1 and wait until the hub acknowledged each: it is durable."""
    topic = "devices/dev1/messages/events/kind={}&$.mid={}"
    mids = [dev.publish(topic.format(kind, mid), mid.encode()) for kind, mid in messages]
    async with asyncio.timeout(10):
        acks = [await dev.publishes.get() for _ in mids]
    assert sorted(acks) == sorted((m, 0) for m in mids)


async def device(rig: Rig) -> Paho:
    dev = Paho.make(DEV.id)
    assert await dev.connect(rig.tcp, user=username(DEV), password=sas(DEV, clock=rig.hub.clock)) == 0
    return dev


async def arrived(sink: MqttCollector, count: int) -> list[tuple[int, bytes]]:
    """Wait until ``count`` distinct records arrived; return (priority, body) of each first arrival, in order."""
    while True:
        seen: dict[bytes, int] = {}
        for m in sink.messages:
            for r in decode_segment(m.payload):
                seen.setdefault(r.body, r.priority)
        if len(seen) >= count:
            return [(p, b) for b, p in seen.items()]
        await sink.wait_for(len(sink.messages) + 1)


async def test_offline_then_online_everything_queued_arrives_highest_priority_first(
    tmp_path: Path, link: LinkSim, cloud: MqttCollector
) -> None:
    link.cut()
    async with asyncio.timeout(40), running_hub(tmp_path, routes=ROUTES, endpoints=[await upstream(link)]) as rig:
        dev = await device(rig)
        await publish(dev, *[("tele", f"t{i}") for i in range(6)])
        await publish(dev, ("alert", "a0"), ("alert", "a1"))
        assert cloud.messages == []
        link.restore()
        got = await arrived(cloud, 8)
        await dev.close()
    assert got == [(0, b"a0"), (0, b"a1"), *[(5, f"t{i}".encode()) for i in range(6)]]


async def test_messages_whose_ttl_passes_while_offline_never_go_and_are_counted(
    tmp_path: Path, link: LinkSim, cloud: MqttCollector
) -> None:
    clock = ManualClock()
    link.cut()
    up = await upstream(link)
    async with asyncio.timeout(40), running_hub(tmp_path, routes=ROUTES, endpoints=[up], clock=clock) as rig:
        dev = await device(rig)
        await publish(dev, ("short", "s0"), ("short", "s1"), ("tele", "t0"))
        clock.advance(31)  # past the 30 s of the "short" route, fixed at enqueue
        link.restore()
        got = await arrived(cloud, 1)
        assert got == [(5, b"t0")]  # the P3 messages would have gone before it: they were dropped
        ex = rig.hub.executors["$upstream"]
        await ex.wait_for(lambda: rig.store.removed[RemovalReason.TTL] == 2)
        await dev.close()
    assert [b for _, b in await arrived(cloud, 1)] == [b"t0"]


async def test_a_hub_restarted_while_offline_still_sends_what_it_acknowledged(
    tmp_path: Path, link: LinkSim, cloud: MqttCollector
) -> None:
    link.cut()
    async with asyncio.timeout(40):
        async with running_hub(tmp_path, routes=ROUTES, endpoints=[await upstream(link)]) as rig:
            dev = await device(rig)
            await publish(dev, *[("tele", f"t{i}") for i in range(4)], ("alert", "a0"))
            await dev.close()
        async with running_hub(tmp_path, routes=ROUTES, endpoints=[await upstream(link)]) as rig:
            assert rig.store.count(P5) == 4
            link.restore()
            got = await arrived(cloud, 5)
    assert got == [(0, b"a0"), *[(5, f"t{i}".encode()) for i in range(4)]]


async def test_a_silently_dead_link_deletes_nothing_before_its_puback(
    tmp_path: Path, link: LinkSim, cloud: MqttCollector
) -> None:
    up = await upstream(link)
    async with asyncio.timeout(40), running_hub(tmp_path, routes=ROUTES, endpoints=[up]) as rig:
        await up.wait_connected()
        dev = await device(rig)
        link.go_silent()  # no acks, no FIN, no RST
        await publish(dev, *[("tele", f"t{i}") for i in range(10)])
        ex = rig.hub.executors["$upstream"]
        await ex.wait_for(lambda: up.status().peak_inflight_bytes > 0)  # handed to the dead link
        await ex.wait_for(lambda: not ex.reachable)  # the ack timeout gave up on the connection
        await ex.cleanup()
        assert rig.store.count(P5) == 10
        assert rig.store.checkpoint(P5).committed == -1
        assert cloud.messages == []
        link.restore()
        got = await arrived(cloud, 10)
        await ex.wait_for(lambda: rig.store.checkpoint(P5).committed == 9)
        await ex.cleanup()
        assert rig.store.count(P5) == 0
        await dev.close()
    assert sorted(b for _, b in got) == sorted(f"t{i}".encode() for i in range(10))
