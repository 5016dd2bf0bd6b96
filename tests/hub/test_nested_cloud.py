"""A parent edgehub and a child edgehub, in one process on real sockets: the child's upstream logs in to the
parent's MQTT head as the device ``gw`` and subscribes for the device behind it; the parent's identities say
``dev-x`` is behind ``gw``. A cloud-to-device message the parent holds for ``dev-x`` reaches the device on the
child (the child's PUBACK, sent once it stored it, is the parent's checkpoint), and a method the parent relays to
``dev-x`` is answered by the device through the child."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from edgehub.core import Identity, Message
from edgehub.core.endpoints import device_endpoint
from edgehub.core.methods import MethodCall, MethodResult
from edgehub.delivery import Endpoint
from edgehub.hub.facade import EdgeHub
from edgehub.hub.methods import UPSTREAM_CALLER
from edgehub.routing import Router
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, WireMode
from edgehub.upstream.mqtt.transport import MqttUpstream
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.mqtt.conftest import HOST, Paho, sas_password, username

pytestmark = [pytest.mark.timeout(60)]

GW = Identity.parse("gw")
DEV = Identity.parse("dev-x")
OTHER = Identity.parse("dev-y")  # a device of the parent, behind no one
EDGE_C = Identity.parse("edge-c")  # the child's own edge device, whose module runs on the child
FILTER = Identity.parse("edge-c/filter")
KEY = base64.b64encode(b"key of dev-x, thirty-two bytes!!").decode()


@dataclass
class Pair:
    parent: EdgeHub
    parent_store: Store
    child: EdgeHub
    child_server: MqttServer
    upstream: MqttUpstream


async def hub(
    stack: AsyncExitStack, data: Path, endpoints: Sequence[Endpoint] = ()
) -> tuple[EdgeHub, MqttServer, Store]:
    store = open_rocks_store(data)
    stack.push_async_callback(store.close)
    router = Router({"up": "FROM /messages/* INTO $upstream"})
    edge = await stack.enter_async_context(EdgeHub(store=store, router=router, host_name=HOST, endpoints=endpoints))
    server = await stack.enter_async_context(MqttServer(edge, settings=MqttSettings(tcp_port=0, tls_port=None)))
    return edge, server, store


@asynccontextmanager
async def nested(tmp_path: Path) -> AsyncIterator[Pair]:
    async with AsyncExitStack() as stack:
        parent, parent_server, parent_store = await hub(stack, tmp_path / "parent")
        await parent.identities.set_password(GW, b"gw-secret")
        for device in (DEV, OTHER, EDGE_C):
            await parent.identities.add_symmetric_key(device, KEY)
        await parent.identities.set_parent(DEV, GW)
        await parent.identities.set_parent(EDGE_C, GW)
        settings = MqttUpstreamSettings(
            host="127.0.0.1",
            port=parent_server.ports["tcp"],
            client_id="gw",
            hub_id="gw",
            username="gw",
            password="gw-secret",
            wire_mode=WireMode.MESSAGE,
        )
        upstream = MqttUpstream(settings)
        stack.push_async_callback(upstream.close)
        child, child_server, _ = await hub(stack, tmp_path / "child", endpoints=[upstream])
        await child.identities.add_symmetric_key(DEV, KEY)
        await child.identities.add_symmetric_key(OTHER, KEY)  # the child asks for it too; the parent says no
        await child.identities.add_symmetric_key(FILTER, KEY)
        await upstream.start()
        async with asyncio.timeout(10):
            await upstream.wait_connected()
            upstream.serve_cloud(child)
            await upstream.wait_cloud_ready()
        yield Pair(parent, parent_store, child, child_server, upstream)


async def device_on_child(pair: Pair) -> Paho:
    dev = Paho.make(DEV.id)
    token = sas_password(DEV, KEY, expiry_s=int(pair.child.clock.time()) + 3600)
    assert await dev.connect(pair.child_server.ports["tcp"], user=username(DEV), password=token) == 0
    dev.client.subscribe([("devices/dev-x/messages/devicebound/#", 1), ("$iothub/methods/POST/#", 0)])
    async with asyncio.timeout(10):
        assert await dev.subscribes.get() == [1, 0]
    return dev


async def test_a_message_the_parent_holds_for_a_device_behind_the_child_reaches_it_and_is_checkpointed(
    tmp_path: Path,
) -> None:
    async with nested(tmp_path) as pair:
        dev = await device_on_child(pair)
        await pair.parent.cloud_to_device("dev-x", Message(b"from the parent", {"k": "v"}, {"messageId": "n1"}))
        async with asyncio.timeout(10):
            got = await dev.messages.get()
            assert got.payload == b"from the parent"
            assert got.topic.startswith("devices/dev-x/messages/devicebound/")
            assert "k=v" in got.topic
            [queue] = pair.parent_store.queues(device_endpoint("dev-x"))
            executor = pair.parent.executors[device_endpoint("dev-x")]
            await executor.wait_for(lambda: pair.parent_store.checkpoint(queue).committed >= 0)  # the child's PUBACK
        assert pair.child.c2d.accepted == 1
        await dev.close()


async def test_a_method_the_parent_relays_is_answered_by_the_device_behind_the_child(tmp_path: Path) -> None:
    async with nested(tmp_path) as pair:
        dev = await device_on_child(pair)
        call = MethodCall("reboot", b'{"in": 3}', 10)
        answer = asyncio.ensure_future(pair.parent.invoke_method(UPSTREAM_CALLER, DEV, call))
        async with asyncio.timeout(10):
            request = await dev.messages.get()
            assert request.topic.startswith("$iothub/methods/POST/reboot/?$rid=")
            assert request.payload == b'{"in": 3}'
            dev.publish(f"$iothub/methods/res/202/?$rid={request.topic.rpartition('=')[2]}", b'"later"', qos=0)
            assert await answer == MethodResult(202, b'"later"')
        # A device of the parent that is behind no one is not the child's to stand in for: 404 at once.
        async with asyncio.timeout(1):
            assert (await pair.parent.invoke_method(UPSTREAM_CALLER, OTHER, call)).status == 404
        await dev.close()


async def test_a_gateway_may_stand_in_only_for_the_devices_behind_it(tmp_path: Path) -> None:
    async with nested(tmp_path) as pair:
        parent_port = pair.upstream.settings.port
        await pair.upstream.close()  # the real child hub leaves; a hand-driven "gw" takes its place
        gw = Paho.make("gw", protocol=MQTTProtocolVersion.MQTTv5)
        assert await gw.connect(parent_port, user="gw", password="gw-secret") == 0
        gw.client.subscribe([("devices/dev-y/messages/devicebound/#", 1), ("devices/dev-x/messages/devicebound/#", 1)])
        async with asyncio.timeout(10):
            assert await gw.subscribes.get() == [0x87, 1]  # dev-y is behind no one: not authorized
            forged = gw.publish("$iothub/dev-y/methods/res/200/?$rid=1", b"{}")
            assert await gw.publishes.get() == (forged, 0x83)  # no call of its own to answer for dev-y
        await gw.close()


async def test_a_gateways_filters_for_its_devices_do_not_count_against_its_subscription_limit(tmp_path: Path) -> None:
    async with nested(tmp_path) as pair:
        parent_port = pair.upstream.settings.port
        await pair.upstream.close()
        gw = Paho.make("gw")
        assert await gw.connect(parent_port, user="gw", password="gw-secret") == 0
        own = [(f"$iothub/twin/res/{i}/#", 0) for i in range(64)]  # its own filters, up to the head's default limit
        gw.client.subscribe(own)
        async with asyncio.timeout(10):
            assert await gw.subscribes.get() == [0] * 64
            gw.client.subscribe([("$iothub/twin/res/x/#", 0), ("devices/dev-x/messages/devicebound/#", 1)])
            assert await gw.subscribes.get() == [0x80, 1]  # one more of its own is refused; dev-x's is not
        await gw.close()


async def test_more_messages_than_one_window_all_reach_the_device_behind_the_child(tmp_path: Path) -> None:
    async with nested(tmp_path) as pair:
        dev = await device_on_child(pair)
        for n in range(40):  # more than the head's outbound window (16) of the child hub's connection, twice over
            await pair.parent.cloud_to_device("dev-x", Message(f"m{n}".encode(), {}, {"messageId": f"m{n}"}))
        async with asyncio.timeout(20):
            got = [(await dev.messages.get()).payload for _ in range(40)]
        assert got == [f"m{n}".encode() for n in range(40)]
        await dev.close()


async def test_a_method_the_parent_relays_to_a_module_behind_the_child_is_answered(tmp_path: Path) -> None:
    async with nested(tmp_path) as pair:
        module = Paho.make(FILTER.id)
        token = sas_password(FILTER, KEY, expiry_s=int(pair.child.clock.time()) + 3600)
        assert await module.connect(pair.child_server.ports["tcp"], user=username(FILTER), password=token) == 0
        module.client.subscribe("$iothub/methods/POST/#", qos=0)
        async with asyncio.timeout(10):
            assert await module.subscribes.get() == [0]
            answer = asyncio.ensure_future(
                pair.parent.invoke_method(UPSTREAM_CALLER, FILTER, MethodCall("setRate", b'{"hz": 2}', 10))
            )
            request = await module.messages.get()
            assert request.topic.startswith("$iothub/methods/POST/setRate/?$rid=")
            module.publish(f"$iothub/methods/res/200/?$rid={request.topic.rpartition('=')[2]}", b'{"ok": 1}', qos=0)
            assert await answer == MethodResult(200, b'{"ok": 1}')
        # A module of a device behind no one is not reached through anyone's link.
        async with asyncio.timeout(1):
            away = await pair.parent.invoke_method(
                UPSTREAM_CALLER, Identity.parse("dev-y/m"), MethodCall("x", b"{}", 5)
            )
        assert away.status == 404
        await module.close()
