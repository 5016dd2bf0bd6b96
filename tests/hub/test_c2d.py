"""Cloud-to-device messages through the real hub: RocksDB store in tmp_path, the MQTT head on 127.0.0.1 port 0,
paho devices. A message for a device is stored durably in its queue, kept while it is away (across a restart),
delivered once it subscribed, checkpointed by its PUBACK; TTL and the per-device bound hold for a device that
never comes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import pytest

from edgehub.core import Identity, IngestRejected, Message, SystemProperty
from edgehub.core.clock import Clock
from edgehub.core.endpoints import device_endpoint
from edgehub.core.refusals import RefusalReason
from edgehub.hub.c2d import C2dLimits
from edgehub.hub.facade import EdgeHub
from edgehub.routing import Router
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing import ManualClock
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, MOD, MODULE_KEY, Paho, sas_password, username

pytestmark = [pytest.mark.timeout(60)]

DEVICEBOUND = device_endpoint("dev1")
FILTER = "devices/dev1/messages/devicebound/#"
EXPIRY = SystemProperty.ABSOLUTE_EXPIRY_TIME.value


@asynccontextmanager
async def served(
    data: Path,
    *,
    routes: Mapping[str, str] | None = None,
    limits: C2dLimits | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[tuple[EdgeHub, MqttServer, Store]]:
    store = open_rocks_store(data / "store", clock=clock)
    try:
        router = Router(dict(routes or {"up": "FROM /messages/* INTO $upstream"}))
        async with EdgeHub(store=store, router=router, host_name=HOST, c2d_limits=limits, clock=clock) as hub:
            await hub.identities.add_symmetric_key(DEV, DEVICE_KEY)
            await hub.identities.add_symmetric_key(MOD, MODULE_KEY)
            async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
                yield hub, server, store
    finally:
        await store.close()


async def device(server: MqttServer, identity: Identity = DEV, key: str = DEVICE_KEY, *, now: float) -> Paho:
    client = Paho.make(identity.id)
    token = sas_password(identity, key, expiry_s=int(now) + 3600)
    assert await client.connect(server.ports["tcp"], user=username(identity), password=token) == 0
    return client


async def subscribed(client: Paho, topic_filter: str = FILTER) -> None:
    client.client.subscribe(topic_filter, qos=1)
    async with asyncio.timeout(10):
        assert await client.subscribes.get() == [1]


def c2d(body: bytes, **system: str) -> Message:
    return Message(body, {"cmd": "on", "note": "a b&c"}, {"messageId": body.decode(), **system})


def bag(topic: str) -> dict[str, str]:
    base = "devices/dev1/messages/devicebound/"
    assert topic.startswith(base)
    return dict((unquote(k), unquote(v)) for k, _, v in (p.partition("=") for p in topic[len(base) :].split("&")))


async def test_a_message_sent_while_the_device_was_away_reaches_it_after_a_restart_and_its_puback_checkpoints_it(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (hub, _, store):
        await hub.cloud_to_device("dev1", c2d(b"m1"))  # returns once durable
        await hub.cloud_to_device("dev1", c2d(b"m2"))
        assert store.usage(DEVICEBOUND)[0] == 2
    async with served(tmp_path) as (hub, server, store):
        dev = await device(server, now=hub.clock.time())
        await subscribed(dev)
        async with asyncio.timeout(10):
            got = [await dev.messages.get() for _ in range(2)]
        assert [m.payload for m in got] == [b"m1", b"m2"]
        first = bag(got[0].topic)
        assert first["$.mid"] == "m1"
        assert first["cmd"] == "on"
        assert first["note"] == "a b&c"
        assert first["$.to"] == "/devices/dev1/messages/deviceBound"  # where it was sent, as IoT Hub says it
        [queue] = store.queues(DEVICEBOUND)
        async with asyncio.timeout(10):  # the device's PUBACKs are the checkpoint
            await hub.executors[DEVICEBOUND].wait_for(lambda: store.checkpoint(queue).committed >= 1)
        await dev.close()


async def test_nothing_goes_to_the_device_before_it_subscribes_to_its_device_bound_topic(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, _):
        dev = await device(server, now=hub.clock.time())
        await hub.cloud_to_device("dev1", c2d(b"early"))
        # The twin request's answer comes after anything the hub had sent before it on this connection.
        await subscribed(dev, "$iothub/twin/res/#")
        dev.publish("$iothub/twin/GET/?$rid=1", b"", qos=0)
        async with asyncio.timeout(10):
            assert (await dev.messages.get()).topic.startswith("$iothub/twin/res/200/")
        await subscribed(dev)
        async with asyncio.timeout(10):
            assert (await dev.messages.get()).payload == b"early"
        await dev.close()


async def test_a_message_past_its_expiry_is_not_delivered_to_a_device_that_comes_late(tmp_path: Path) -> None:
    clock = ManualClock()
    soon = datetime.fromtimestamp(clock.time() + 10, tz=UTC).isoformat().replace("+00:00", "Z")
    async with served(tmp_path, clock=clock, limits=C2dLimits(ttl_s=600)) as (hub, server, _):
        await hub.cloud_to_device("dev1", c2d(b"stale", **{EXPIRY: soon}))  # ttl 10 s from its expiry
        await hub.cloud_to_device("dev1", c2d(b"fresh"))  # ttl 600 s from the limits
        clock.advance(60)
        dev = await device(server, now=clock.time())
        await subscribed(dev)
        async with asyncio.timeout(10):
            assert (await dev.messages.get()).payload == b"fresh"
        await dev.close()


async def test_the_upstream_may_queue_only_so_much_for_a_known_device_and_nothing_for_an_unknown_one(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, limits=C2dLimits(max_queued=2, max_message_bytes=100)) as (hub, _, store):
        await hub.cloud_to_device("dev1", c2d(b"1"))
        await hub.cloud_to_device("dev1", c2d(b"2"))
        with pytest.raises(IngestRejected) as full:
            await hub.cloud_to_device("dev1", c2d(b"3"))
        assert full.value.reason is RefusalReason.DEVICE_QUEUE_FULL
        with pytest.raises(IngestRejected) as unknown:
            await hub.cloud_to_device("nobody", c2d(b"x"))
        assert unknown.value.reason is RefusalReason.UNKNOWN_DEVICE
        with pytest.raises(IngestRejected) as module:
            await hub.cloud_to_device("dev1/filter", c2d(b"x"))
        assert module.value.reason is RefusalReason.UNKNOWN_DEVICE
        with pytest.raises(IngestRejected) as large:
            await hub.cloud_to_device("dev1", Message(b"x" * 101, {}, {}))
        assert large.value.reason is RefusalReason.MESSAGE_TOO_LARGE
        assert store.usage(DEVICEBOUND)[0] == 2
        assert hub.refusals.total == 4


async def test_a_route_whose_sink_names_a_device_delivers_a_module_output_to_that_device(tmp_path: Path) -> None:
    routes = {"toDevice": f"FROM /messages/modules/filter/outputs/* INTO BrokeredEndpoint('{DEVICEBOUND}')"}
    async with served(tmp_path, routes=routes) as (hub, server, _):
        now = hub.clock.time()
        dev = await device(server, now=now)
        await subscribed(dev)
        module = await device(server, MOD, MODULE_KEY, now=now)
        sent = module.publish("devices/dev1/modules/filter/messages/events/$.on=out1&k=v", b"for the device")
        async with asyncio.timeout(10):
            assert await module.publishes.get() == (sent, 0)
            got = await dev.messages.get()
        assert got.payload == b"for the device"
        assert bag(got.topic)["k"] == "v"
        assert bag(got.topic)["$.cmid"] == "filter"
        await module.close()
        await dev.close()


async def test_the_devices_the_hub_serves_are_each_device_once_with_its_modules_device_among_them() -> None:
    store = Store.in_memory()
    try:
        registry = EdgeHub(store=store, router=Router({}), host_name=HOST).identities
        for identity in ("edge/filter", "edge-x", "edge", "edge/sensor", "dev1"):
            await registry.add_symmetric_key(Identity.parse(identity))
        assert registry.device_ids() == ["dev1", "edge", "edge-x"]
        assert registry.device_ids(limit=2) == ["dev1", "edge"]
    finally:
        await store.close()


async def test_more_messages_than_one_window_all_reach_the_device_in_order(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, _):
        for n in range(40):  # more than the head's outbound window (16), twice over
            await hub.cloud_to_device("dev1", c2d(f"m{n}".encode()))
        dev = await device(server, now=hub.clock.time())
        await subscribed(dev)
        async with asyncio.timeout(20):
            got = [(await dev.messages.get()).payload for _ in range(40)]
        assert got == [f"m{n}".encode() for n in range(40)]
        await dev.close()
