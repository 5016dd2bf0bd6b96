"""The upstream's cloud side against a real Mosquitto standing in for the cloud: the whole hub (RocksDB store in
tmp_path, the MQTT head on port 0) with an ``MqttUpstream`` serving it, a paho client on the broker as the cloud,
paho devices and modules on the head.

A device-bound message the cloud publishes for a device is stored and reaches the device; a direct method the
cloud invokes reaches the target and its answer comes back to the cloud on the response topic; a call for a
target that is not connected is answered 404 in IoT Hub's form."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgehub.core import Identity
from edgehub.hub.facade import EdgeHub
from edgehub.routing import Router
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing.linksim import LinkSim
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MAX_SESSION_EXPIRY_S, MqttProtocol, MqttUpstreamSettings, WireMode
from edgehub.upstream.mqtt.transport import MqttUpstream
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, MOD, MODULE_KEY, Paho, sas_password, username

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


@dataclass
class Cloudy:
    hub: EdgeHub
    server: MqttServer
    store: Store
    upstream: MqttUpstream
    cloud: Paho


@asynccontextmanager
async def served(
    data: Path, broker: MosquittoPeer, *, port: int | None = None, protocol: MqttProtocol = MqttProtocol.V311
) -> AsyncIterator[Cloudy]:
    """The hub served by an upstream to ``broker`` (through ``port``, a link to it, when given)."""
    store = open_rocks_store(data / "store")
    settings = MqttUpstreamSettings(
        host=broker.host,
        port=port or broker.port,
        client_id="gw",
        hub_id="gw",
        wire_mode=WireMode.MESSAGE,
        protocol=protocol,
        reconnect_min_s=0.05,
    )
    upstream = MqttUpstream(settings)
    try:
        router = Router({"up": "FROM /messages/* INTO $upstream"})
        async with EdgeHub(store=store, router=router, host_name=HOST, endpoints=[upstream]) as hub:
            await hub.identities.add_symmetric_key(DEV, DEVICE_KEY)
            await hub.identities.add_symmetric_key(MOD, MODULE_KEY)
            await upstream.start()
            async with asyncio.timeout(10):
                await upstream.wait_connected()
            cloud = Paho.make("cloud")
            assert await cloud.connect(broker.port) == 0
            cloud.client.subscribe("$iothub/+/methods/res/#", qos=0)
            cloud.client.subscribe("$iothub/+/+/methods/res/#", qos=0)
            async with asyncio.timeout(10):
                await cloud.subscribes.get()
                await cloud.subscribes.get()
            upstream.serve_cloud(hub)  # subscribes for dev1 on the connection that is up
            async with asyncio.timeout(10):
                await upstream.wait_cloud_ready()
            async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
                yield Cloudy(hub, server, store, upstream, cloud)
            await cloud.close()
    finally:
        await upstream.close()
        await store.close()


async def connected(rig: Cloudy, identity: Identity, key: str, topic_filter: str) -> Paho:
    client = Paho.make(identity.id)
    token = sas_password(identity, key, expiry_s=int(rig.hub.clock.time()) + 3600)
    assert await client.connect(rig.server.ports["tcp"], user=username(identity), password=token) == 0
    client.client.subscribe(topic_filter, qos=1)
    async with asyncio.timeout(10):
        await client.subscribes.get()
    return client


async def test_a_device_bound_message_from_the_cloud_is_stored_then_reaches_the_device(
    tmp_path: Path, broker: MosquittoPeer
) -> None:
    async with served(tmp_path, broker) as rig:
        dev = await connected(rig, DEV, DEVICE_KEY, "devices/dev1/messages/devicebound/#")
        rig.cloud.publish("devices/dev1/messages/devicebound/$.mid=c2d-1&kind=cmd&note=a%20b", b"on", qos=1)
        async with asyncio.timeout(10):
            await rig.cloud.publishes.get()
            got = await dev.messages.get()
        assert got.payload == b"on"
        assert "$.mid=c2d-1" in got.topic
        assert "kind=cmd" in got.topic
        assert "note=a%20b" in got.topic
        await dev.close()


@pytest.mark.parametrize("protocol", [MqttProtocol.V311, MqttProtocol.V5])
async def test_a_device_bound_message_sent_while_the_upstream_is_down_waits_at_the_broker_and_reaches_the_device(
    tmp_path: Path, broker: MosquittoPeer, protocol: MqttProtocol
) -> None:
    async with (
        LinkSim(target_host=broker.host, target_port=broker.port) as link,
        served(tmp_path, broker, port=link.port, protocol=protocol) as rig,
    ):
        dev = await connected(rig, DEV, DEVICE_KEY, "devices/dev1/messages/devicebound/#")
        async with asyncio.timeout(20):
            link.cut()  # the hub's upstream is down: the broker keeps its session and queues for it
            await rig.upstream.wait_for(lambda: not rig.upstream.connected)
            rig.cloud.publish("devices/dev1/messages/devicebound/$.mid=while-away", b"queued", qos=1)
            await rig.cloud.publishes.get()  # the broker has it
            link.restore()
            got = await dev.messages.get()
        assert got.payload == b"queued"
        assert "$.mid=while-away" in got.topic
        await dev.close()


async def test_a_method_the_cloud_invokes_is_answered_by_the_module_and_a_call_to_one_away_gets_404(
    tmp_path: Path, broker: MosquittoPeer
) -> None:
    async with served(tmp_path, broker) as rig:
        # A call to a module that is not connected: 404 (DeviceNotOnline), answered on the response topic.
        rig.cloud.publish("$iothub/dev1/filter/methods/POST/probe/?$rid=0", b"{}", qos=0)
        async with asyncio.timeout(10):
            away = await rig.cloud.messages.get()
        assert away.topic == "$iothub/dev1/filter/methods/res/404/?$rid=0"
        assert json.loads(away.payload)["errorCode"] == 404103
        module = await connected(rig, MOD, MODULE_KEY, "$iothub/methods/POST/#")
        rig.cloud.publish("$iothub/dev1/filter/methods/POST/setRate/?$rid=42&$timeout=10", b'{"hz": 5}', qos=1)
        async with asyncio.timeout(10):
            request = await module.messages.get()
            assert request.topic.startswith("$iothub/methods/POST/setRate/?$rid=")
            assert request.payload == b'{"hz": 5}'
            rid = request.topic.rpartition("$rid=")[2]
            module.publish(f"$iothub/methods/res/200/?$rid={rid}", b'{"hz": 5, "ok": true}', qos=1)
            answer = await rig.cloud.messages.get()
        assert answer.topic == "$iothub/dev1/filter/methods/res/200/?$rid=42"
        assert answer.payload == b'{"hz": 5, "ok": true}'
        assert rig.store.usage("$upstream") == (0, 0)  # the answer went to the caller, not to routing
        await module.close()


def test_the_session_expiry_is_bounded() -> None:
    for bad in (-1, MAX_SESSION_EXPIRY_S + 1):
        with pytest.raises(ValueError, match="session_expiry_s"):
            MqttUpstreamSettings(host="h", client_id="gw", hub_id="gw", session_expiry_s=bad)
    assert MqttUpstreamSettings(host="h", client_id="gw", hub_id="gw").session_expiry_s == 86_400


async def test_a_device_bound_message_over_the_upstreams_limit_is_acked_and_dropped_and_the_next_one_arrives(
    tmp_path: Path, broker: MosquittoPeer, caplog: pytest.LogCaptureFixture
) -> None:
    # MQTT 3.1.1 with the session kept (the default): the broker cannot be told a limit and, if the hub dropped the
    # connection instead of acknowledging, would send the 1.5 MB message again on every connection, ahead of
    # everything queued behind it.
    caplog.set_level(logging.INFO)
    async with served(tmp_path, broker) as rig:
        dev = await connected(rig, DEV, DEVICE_KEY, "devices/dev1/messages/devicebound/#")
        rig.cloud.publish("devices/dev1/messages/devicebound/$.mid=huge", b"x" * 1_500_000, qos=1)
        rig.cloud.publish("devices/dev1/messages/devicebound/$.mid=after", b"after", qos=1)
        async with asyncio.timeout(20):
            await rig.cloud.publishes.get()
            await rig.cloud.publishes.get()
            got = await dev.messages.get()
        assert got.payload == b"after"
        assert rig.upstream.connected
        await dev.close()
    lines = [r.getMessage() for r in caplog.records if "reason=packet_too_large" in r.getMessage()]
    assert len(lines) == 1
    assert "outcome=acknowledged_and_dropped" in lines[0]


async def test_a_call_whose_answer_topic_could_not_be_sent_is_refused_with_a_line_and_the_next_is_answered(
    tmp_path: Path, broker: MosquittoPeer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with served(tmp_path, broker) as rig:
        # The hub subscribes to $iothub/dev1/+/methods/POST/#: any module name of dev1 reaches it. A call topic of
        # MQTT's longest (65,535 bytes) would be answered 404 on a topic one byte longer, which MQTT cannot carry.
        head, tail = "$iothub/dev1/", "/methods/POST/x/?$rid=1"
        topic = head + "m" * (65_535 - len(head) - len(tail)) + tail
        assert len(topic) == 65_535
        rig.cloud.publish(topic, b"{}", qos=0)
        rig.cloud.publish("$iothub/dev1/filter/methods/POST/probe/?$rid=2", b"{}", qos=0)
        async with asyncio.timeout(10):
            answer = await rig.cloud.messages.get()
        assert answer.topic == "$iothub/dev1/filter/methods/res/404/?$rid=2"  # the one after it is answered
    refused = [r.getMessage() for r in caplog.records if "reason=topic_invalid" in r.getMessage()]
    assert len(refused) == 1, refused
    assert "peer=$upstream" in refused[0]
