"""Direct methods through the real hub: RocksDB store in tmp_path, the MQTT head on 127.0.0.1 port 0, paho
targets. A call reaches the connected target on ``$iothub/methods/POST/{name}/?$rid=``, its answer on
``$iothub/methods/res/{status}/?$rid=`` goes back to the caller and is never routed; a target away is 404, a
silent one 504, and every bound answers with IoT Hub's status at once."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from edgehub.core import Identity
from edgehub.core.methods import MethodCall, MethodResult
from edgehub.hub.facade import EdgeHub
from edgehub.hub.methods import UPSTREAM_CALLER, MethodLimits
from edgehub.routing import Router
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, MOD, MODULE_KEY, Paho, sas_password, username

pytestmark = [pytest.mark.timeout(60)]

METHODS = "$iothub/methods/POST/#"
SENSOR = Identity.parse("dev1/sensor")
SENSOR_KEY = base64.b64encode(b"module key for dev1/sensor.....").decode()
LIMITS = MethodLimits(min_timeout_s=0.1, max_timeout_s=20.0, max_pending_per_connection=2, max_payload_bytes=1000)


@asynccontextmanager
async def served(data: Path, limits: MethodLimits = LIMITS) -> AsyncIterator[tuple[EdgeHub, MqttServer, Store]]:
    store = open_rocks_store(data / "store")
    try:
        router = Router({"telemetry": "FROM /messages/* INTO $upstream"})
        async with EdgeHub(store=store, router=router, host_name=HOST, method_limits=limits) as hub:
            await hub.identities.add_symmetric_key(DEV, DEVICE_KEY)
            await hub.identities.add_symmetric_key(MOD, MODULE_KEY)
            await hub.identities.add_symmetric_key(SENSOR, SENSOR_KEY)
            async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
                yield hub, server, store
    finally:
        await store.close()


async def target(
    hub: EdgeHub,
    server: MqttServer,
    identity: Identity = DEV,
    key: str = DEVICE_KEY,
    *,
    listen: bool = True,
    protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv311,
) -> Paho:
    client = Paho.make(identity.id, protocol=protocol)
    token = sas_password(identity, key, expiry_s=int(hub.clock.time()) + 3600)
    rc = await client.connect(server.ports["tcp"], user=username(identity), password=token)
    assert rc == 0
    if listen:
        client.client.subscribe(METHODS, qos=0)
        async with asyncio.timeout(10):
            assert await client.subscribes.get() == [0]
    return client


def rid_of(topic: str) -> str:
    return topic.rpartition("$rid=")[2]


def error_code(result: MethodResult) -> int:
    body: dict[str, object] = json.loads(result.payload)
    code = body["errorCode"]
    assert isinstance(code, int)
    return code


async def test_a_call_reaches_the_connected_device_and_its_answer_comes_back_with_status_and_payload(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (hub, server, store):
        dev = await target(hub, server)
        call = asyncio.ensure_future(hub.invoke_method(UPSTREAM_CALLER, DEV, MethodCall("reboot", b'{"delay": 3}', 10)))
        async with asyncio.timeout(10):
            request = await dev.messages.get()
        assert request.topic.startswith("$iothub/methods/POST/reboot/?$rid=")
        assert request.payload == b'{"delay": 3}'
        sent = dev.publish(f"$iothub/methods/res/201/?$rid={rid_of(request.topic)}", b'{"ok": true}')
        async with asyncio.timeout(10):
            assert await call == MethodResult(201, b'{"ok": true}')
            assert await dev.publishes.get() == (sent, 0)
        # The answer went to the caller and nowhere else: FROM /messages/* took nothing.
        assert store.usage("$upstream") == (0, 0)
        assert hub.methods.pending == 0
        await dev.close()


async def test_a_module_calls_another_module_through_the_hub(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, _):
        mod = await target(hub, server, MOD, MODULE_KEY)
        call = asyncio.ensure_future(hub.invoke_method("dev1/sensor", MOD, MethodCall("getTemp", b"{}", 10)))
        async with asyncio.timeout(10):
            request = await mod.messages.get()
            mod.publish(f"$iothub/methods/res/200/?$rid={rid_of(request.topic)}", b"21.5", qos=0)
            assert await call == MethodResult(200, b"21.5")
        await mod.close()


async def test_a_target_that_is_not_connected_or_not_listening_gets_404_at_once(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, _):
        async with asyncio.timeout(1):  # far less than the call's timeout: 404 is answered at once
            away = await hub.invoke_method(UPSTREAM_CALLER, MOD, MethodCall("m", b"{}", 10))
        assert away.status == 404
        assert error_code(away) == 404103
        deaf = await target(hub, server, listen=False)
        async with asyncio.timeout(1):
            result = await hub.invoke_method(UPSTREAM_CALLER, DEV, MethodCall("m", b"{}", 10))
        assert result.status == 404
        await deaf.close()


async def test_a_target_that_does_not_answer_gets_504_and_a_late_answer_is_refused(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, store):
        dev = await target(hub, server, protocol=MQTTProtocolVersion.MQTTv5)
        async with asyncio.timeout(10):
            result = await hub.invoke_method(UPSTREAM_CALLER, DEV, MethodCall("slow", b"{}", 0.3))
            request = await dev.messages.get()
        assert result.status == 504
        assert error_code(result) == 504101
        late = dev.publish(f"$iothub/methods/res/200/?$rid={rid_of(request.topic)}", b"{}")
        async with asyncio.timeout(10):
            assert await dev.publishes.get() == (late, 0x83)  # no call waits for it: refused, not telemetry
        assert store.usage("$upstream") == (0, 0)
        await dev.close()


async def test_a_target_that_disconnects_while_a_call_waits_answers_it_404(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, _):
        dev = await target(hub, server)
        call = asyncio.ensure_future(hub.invoke_method(UPSTREAM_CALLER, DEV, MethodCall("m", b"{}", 15)))
        async with asyncio.timeout(10):
            await dev.messages.get()
            await dev.close()
            result = await call
        assert result.status == 404
        assert error_code(result) == 404104


async def test_calls_over_their_bounds_are_refused_with_iot_hubs_status(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, _):
        dev = await target(hub, server)

        async def invoke(call: MethodCall) -> MethodResult:
            async with asyncio.timeout(1):
                return await hub.invoke_method(UPSTREAM_CALLER, DEV, call)

        assert (await invoke(MethodCall("big", b"x" * 1001, 10))).status == 400
        assert (await invoke(MethodCall("a/b", b"{}", 10))).status == 400
        assert (await invoke(MethodCall("", b"{}", 10))).status == 400
        assert (await invoke(MethodCall("m", b"{}", 0.01))).status == 400
        assert (await invoke(MethodCall("m", b"{}", 21))).status == 400
        # Two calls wait on the connection (its bound); the third is throttled.
        waiting = [
            asyncio.ensure_future(hub.invoke_method(UPSTREAM_CALLER, DEV, MethodCall("m", b"{}", 15))) for _ in "ab"
        ]
        async with asyncio.timeout(10):
            requests = [await dev.messages.get() for _ in waiting]
        third = await invoke(MethodCall("m", b"{}", 10))
        assert third.status == 429
        assert error_code(third) == 429002
        for request in requests:
            dev.publish(f"$iothub/methods/res/200/?$rid={rid_of(request.topic)}", b"{}", qos=0)
        async with asyncio.timeout(10):
            assert [r.status for r in await asyncio.gather(*waiting)] == [200, 200]
        assert dev.messages.empty()  # nothing refused ever reached the device
        await dev.close()


async def test_an_answer_from_another_client_than_the_target_is_refused(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, _):
        dev = await target(hub, server)
        other = await target(hub, server, MOD, MODULE_KEY, protocol=MQTTProtocolVersion.MQTTv5)
        call = asyncio.ensure_future(hub.invoke_method(UPSTREAM_CALLER, DEV, MethodCall("m", b"{}", 10)))
        async with asyncio.timeout(10):
            rid = rid_of((await dev.messages.get()).topic)
            forged = other.publish(f"$iothub/methods/res/200/?$rid={rid}", b"forged")
            assert await other.publishes.get() == (forged, 0x83)
            dev.publish(f"$iothub/methods/res/200/?$rid={rid}", b"real", qos=0)
            assert await call == MethodResult(200, b"real")
        await other.close()
        await dev.close()


async def test_a_module_calls_another_module_over_mqtt_and_gets_the_answer_on_its_response_topic(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (hub, server, store):
        callee = await target(hub, server, MOD, MODULE_KEY)
        caller = await target(hub, server, SENSOR, SENSOR_KEY, listen=False)
        caller.client.subscribe("$iothub/+/+/methods/res/#", qos=0)
        async with asyncio.timeout(10):
            assert await caller.subscribes.get() == [0]
            sent = caller.publish("$iothub/dev1/filter/methods/POST/getTemp/?$rid=r1&$timeout=5", b'{"unit": "C"}')
            assert await caller.publishes.get() == (sent, 0)
            request = await callee.messages.get()
            assert request.topic.startswith("$iothub/methods/POST/getTemp/?$rid=")
            assert request.payload == b'{"unit": "C"}'
            callee.publish(f"$iothub/methods/res/200/?$rid={rid_of(request.topic)}", b"21.5", qos=0)
            answer = await caller.messages.get()
            assert answer.topic == "$iothub/dev1/filter/methods/res/200/?$rid=r1"
            assert answer.payload == b"21.5"
            # A call to a module that is not connected: 404 on the same topic, at once.
            caller.publish("$iothub/dev1/absent/methods/POST/getTemp/?$rid=r2&$timeout=5", b"{}", qos=0)
            away = await caller.messages.get()
        assert away.topic == "$iothub/dev1/absent/methods/res/404/?$rid=r2"
        assert store.usage("$upstream") == (0, 0)  # neither call nor answer was routed
        await caller.close()
        await callee.close()


async def test_a_device_may_not_call_a_method(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, _):
        callee = await target(hub, server, MOD, MODULE_KEY)
        dev = await target(hub, server, listen=False, protocol=MQTTProtocolVersion.MQTTv5)
        sent = dev.publish("$iothub/dev1/filter/methods/POST/getTemp/?$rid=r1", b"{}")
        async with asyncio.timeout(10):
            assert await dev.publishes.get() == (sent, 0x87)  # not authorized
        assert callee.messages.empty()
        await dev.close()
        await callee.close()


async def test_the_hub_wide_bound_on_pending_calls_holds_across_targets(tmp_path: Path) -> None:
    limits = MethodLimits(min_timeout_s=0.1, max_pending=1)
    async with served(tmp_path, limits) as (hub, server, _):
        dev = await target(hub, server)
        mod = await target(hub, server, MOD, MODULE_KEY)
        first = asyncio.ensure_future(hub.invoke_method(UPSTREAM_CALLER, DEV, MethodCall("m", b"{}", 15)))
        async with asyncio.timeout(10):
            request = await dev.messages.get()
            other = await hub.invoke_method(UPSTREAM_CALLER, MOD, MethodCall("m", b"{}", 15))
            assert other.status == 429  # another target, but the hub holds its one pending call
            dev.publish(f"$iothub/methods/res/200/?$rid={rid_of(request.topic)}", b"{}", qos=0)
            assert (await first).status == 200
        assert mod.messages.empty()
        await mod.close()
        await dev.close()
