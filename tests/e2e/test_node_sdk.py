"""The Azure IoT device SDK for Node (``azure-iot-device`` with its ``Amqp``, ``Mqtt``, ``AmqpWs`` and ``MqttWs``
transports, versions pinned in ``tests/e2e/node_sdk/package-lock.json``, installed by ``make node-sdk``) against the
real hub: RocksDB store in tmp_path, real routes, the AMQP and MQTT heads over TLS and the WebSocket listener in
front of both. The SDK is unmodified and driven as its samples drive it (``node_sdk/driver.js``, one scenario a run,
JSON lines on stdout), as a subprocess of the test.

Each test runs once per transport (``TRANSPORTS``): the same scenario over AMQP, MQTT, AMQP over WebSockets and MQTT
over WebSockets.

How the SDK reaches a free port: it dials ``{GatewayHostName}`` with the scheme's port (5671, 8883) unless the
host carries one: both transports build their URL as ``amqps://`` or ``mqtts://`` + the gateway host name and
honour a port in it (azure-iot-amqp-base's ``connect`` takes ``parsedUrl.port``, mqtt.js the URL's), so the
connection string says ``GatewayHostName=127.0.0.1:{port}``, and a hub left running on 5671 or 8883 breaks
nothing. The SAS token's resource is ``HostName``, the hub's name, as ever.

The WebSocket transports take no port from the gateway: they dial ``wss://{GatewayHostName}:443/$iothub/websocket``
(a port in the host would make that URL malformed). So their connection string says ``GatewayHostName=127.0.0.1``
and the driver gives the SDK an HTTP CONNECT proxy, as the SDK's users behind a proxy give it one (its
``webSocketAgent`` option): ``edgehub.testing.connect_proxy``, whose one route sends ``127.0.0.1:443`` to the hub's
free ``wss`` port. Nothing else is tunnelled, so a client that did not go over its WebSocket cannot pass.

A missing Node or SDK fails these tests with what to run; it never skips them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import shutil
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgehub.core import Identity, Message
from edgehub.core.endpoints import device_endpoint
from edgehub.core.methods import MethodCall, MethodResult
from edgehub.core.sas import ConnectionString
from edgehub.delivery import ExecutorSettings, RetryPolicy
from edgehub.store import StoredItem
from edgehub.testing.connect_proxy import ConnectProxy
from edgehub.testing.peers import MosquittoPeer
from protocol_heads.amqp import AmqpServer, AmqpSettings
from protocol_heads.listeners import HeadServer
from protocol_heads.websocket import SUBPROTOCOL_AMQP, SUBPROTOCOL_MQTT, WebSocketServer, WebSocketSettings
from tests.e2e.conftest import DEV, FILTER, HOST, KEYS, LONG_WAIT, Rig, running_hub
from tests.e2e.driver_process import DriverRun, driver_process
from tests.e2e.hub_process import identity_add, start, stop
from tests.e2e.test_amqp_e2e import amqps_port
from tests.e2e.test_websocket_e2e import wss_port
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

SDK_DIR = Path(__file__).with_name("node_sdk")
DRIVER = SDK_DIR / "driver.js"
STEP_S = 30.0  # the longest any one SDK step (start, connect, send, receive) may take
# The SDK's transports under test (the driver's names). The WebSocket ones dial {gateway}:443 whatever it says, so
# they go through ``Hub.proxy`` (``WEBSOCKETS``).
TRANSPORTS = ["amqp", "mqtt", "amqp-ws", "mqtt-ws"]
WEBSOCKETS = {"amqp-ws", "mqtt-ws"}
WSS_PORT = 443  # the one port the SDK's WebSocket transports dial
ROUTES = {"all": "FROM /messages/* WHERE $connectionDeviceId = 'dev1' INTO $upstream"}
QUICK_RETRY = ExecutorSettings(retry_policy=RetryPolicy(minimum_delay_s=0.2, maximum_delay_s=0.2))


def gateway(transport: str, ports: dict[str, int]) -> str:
    """The connection string's ``GatewayHostName`` for ``transport``: the head's own port (``ports``, by transport:
    "amqp", "mqtt", "wss") in it, except for the WebSocket transports, which dial 443 through the proxy."""
    return "127.0.0.1" if transport in WEBSOCKETS else f"127.0.0.1:{ports[transport]}"


def through_proxy(transport: str, proxy: ConnectProxy) -> dict[str, Any]:
    """The driver's spec key that gives a WebSocket transport the proxy; nothing for the others."""
    return {"proxy": f"http://127.0.0.1:{proxy.port}"} if transport in WEBSOCKETS else {}


@dataclass
class Hub:
    rig: Rig
    ports: dict[str, int]  # "amqp", "mqtt": the TLS port that head listens on; "wss": the WebSocket listener's
    proxy: ConnectProxy  # 127.0.0.1:443 to ports["wss"]

    def connection_string(self, identity: Identity, transport: str) -> str:
        return ConnectionString(
            host_name=HOST,
            device_id=identity.device_id,
            module_id=identity.module_id,
            shared_access_key=KEYS[identity.id],
            gateway_host_name=gateway(transport, self.ports),
        ).format()

    def reach(self, transport: str) -> dict[str, Any]:
        return through_proxy(transport, self.proxy)


@asynccontextmanager
async def hub_with_every_head(data: Path, settings: ExecutorSettings = LONG_WAIT) -> AsyncIterator[Hub]:
    """The real hub (``running_hub``: its MQTT head on TLS), its AMQP head on TLS too, and the WebSocket listener
    (TLS) in front of both heads, each on a free port; the proxy that takes the SDK's 443 to that listener."""
    async with running_hub(data, routes=ROUTES, settings=settings) as rig:
        pair = rig.ca.server()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(pair.cert, pair.key)
        amqp_settings = AmqpSettings(tcp_port=None, tls_port=0, ssl_context=ctx, connect_timeout_s=10.0)
        ws_settings = WebSocketSettings(tls_port=0, ssl_context=ctx, connect_timeout_s=10.0)
        async with AmqpServer(rig.hub, settings=amqp_settings) as amqp:
            heads: dict[str, HeadServer[Any, Any]] = {SUBPROTOCOL_MQTT: rig.server, SUBPROTOCOL_AMQP: amqp}
            async with WebSocketServer(rig.hub, settings=ws_settings, heads=heads) as ws:
                wss = ws.ports["wss"]
                async with ConnectProxy({("127.0.0.1", WSS_PORT): ("127.0.0.1", wss)}) as proxy:
                    yield Hub(rig, {"amqp": amqp.ports["amqps"], "mqtt": rig.tls, "wss": wss}, proxy)


class Driver(DriverRun):
    """One Node driver process; ``event()`` reads its next JSON line."""

    STEP_S = STEP_S
    WHO = "the Node SDK driver"

    async def event(self, *, error_expected: bool = False) -> dict[str, Any]:
        event = await self.next_event()
        if event.get("event") == "error" and not error_expected:
            pytest.fail(f"the Node SDK driver failed: {event}; its stderr:\n{await self.said()}")
        return event


@pytest.fixture(scope="session")
def node() -> str:
    hint = "`make node-sdk` installs Node and the SDK (tests/e2e/node_sdk)"
    found = shutil.which("node")
    if found is None:
        pytest.fail(f"no `node` on PATH; {hint}", pytrace=False)
    if not (SDK_DIR / "node_modules" / "azure-iot-device-amqp").is_dir():
        pytest.fail(f"the Node SDK is not installed in {SDK_DIR / 'node_modules'}; {hint}", pytrace=False)
    return found


@asynccontextmanager
async def driver(node: str, logs: Path, transport: str, scenario: str, ca: Path, **spec: Any) -> AsyncIterator[Driver]:
    spec = {"ca": str(ca), "timeout_s": STEP_S * 3} | spec
    stderr = logs / f"node-{transport}-{scenario}.log"
    # DEBUG=azure*: the SDK's own trace, in the log a failing test shows.
    env = os.environ | {"DEBUG": "azure*,rhea*"}
    async with driver_process([node, str(DRIVER), transport, scenario, json.dumps(spec)], stderr, env) as proc:
        yield Driver(proc, stderr)


def stored(rig: Rig, endpoint: str) -> list[StoredItem]:
    return [item for q in rig.store.queues(endpoint) for item in rig.store.read(q, 0, 100)]


async def invoke_until_listening(rig: Rig, target: Identity, call: MethodCall) -> MethodResult:
    """The call, again while it is 404: the SDK attaches its method links (or subscribes) in the background after
    the driver said it listens, and IoT Hub answers 404 until then. Bounded by STEP_S."""
    async with asyncio.timeout(STEP_S):
        while (result := await rig.hub.invoke_method("$upstream", target, call)).status == 404:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # no event says the SDK has attached: polled, bounded
    return result


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_node_sdk_device_sends_patches_its_twin_takes_a_c2d_message_and_answers_a_method(
    tmp_path: Path, node: str, transport: str
) -> None:
    messages: list[dict[str, Any]] = [
        {"data": '{"t": 21.5}', "message_id": "m-1", "content_type": "application/json", "properties": {"k": "v"}},
        {"data": '{"t": 30}', "message_id": "m-2", "correlation_id": "c-2"},
    ]
    async with hub_with_every_head(tmp_path) as hub:
        rig = hub.rig
        spec: dict[str, Any] = {"connection_string": hub.connection_string(DEV, transport), "messages": messages}
        spec |= {"report": {"firmware": "1.2", "nested": {"a": 1}}, "c2d": 1, "methods": 1} | hub.reach(transport)
        async with driver(node, tmp_path, transport, "device", rig.ca.ca_pem, **spec) as run:
            assert await run.event() == {"event": "connected"}
            for i in range(len(messages)):
                assert await run.event() == {"event": "sent", "index": i}
                # sendEvent resolved, so the SDK had its outcome (AMQP) or PUBACK (MQTT): durable by now.
                assert len(stored(rig, "$upstream")) == i + 1
            twin = await run.event()
            assert twin["event"] == "twin"
            assert twin["desired"] == {"$version": 1}
            assert twin["reported"] == {"$version": 1}
            assert await run.event() == {"event": "reported"}
            assert await run.event() == {"event": "ready"}

            await rig.hub.cloud_to_device("dev1", Message(b"hello", {"cmd": "on"}, {"messageId": "c2d-1"}))
            c2d = await run.event()
            assert (c2d["event"], c2d["outcome"]) == ("c2d", "complete")
            assert c2d["data"] == "hello"
            assert c2d["message_id"] == "c2d-1"
            assert c2d["properties"]["cmd"] == "on"

            result = await invoke_until_listening(rig, DEV, MethodCall("echo", b'{"x": 1}', timeout_s=10))
            assert await run.event() == {"event": "method", "name": "echo", "payload": {"x": 1}}
            assert result.status == 200
            assert json.loads(result.payload) == {"echo": {"x": 1}}
            assert await run.event() == {"event": "done"}
            assert await run.exit_code() == 0
        # over its WebSocket (the proxy's one route) or not through the proxy at all
        assert hub.proxy.tunnels == (1 if transport in WEBSOCKETS else 0)

        first, second = (item.message for item in stored(rig, "$upstream"))
        assert first.body == b'{"t": 21.5}'
        assert first.properties == {"k": "v"}
        assert first.system_properties["messageId"] == "m-1"
        assert first.system_properties["contentType"] == "application/json"
        assert first.system_properties["connectionDeviceId"] == "dev1"
        assert second.system_properties["cid"] == "c-2"
        reported = (await rig.hub.get_twin(DEV))["reported"]
        assert reported == {"firmware": "1.2", "nested": {"a": 1}, "$version": 2}
        # complete() settled it: the device's queue is checkpointed past the message.
        [queue] = rig.store.queues(device_endpoint("dev1"))
        executor = rig.hub.executors[device_endpoint("dev1")]
        async with asyncio.timeout(STEP_S):
            await executor.wait_for(lambda: rig.store.checkpoint(queue).committed >= 0)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_node_sdk_module_gets_its_desired_properties_and_each_change_pushed_and_answers_a_method(
    tmp_path: Path, node: str, transport: str
) -> None:
    async with hub_with_every_head(tmp_path) as hub:
        rig = hub.rig
        rig.hub.set_module_desired("filter", {"threshold": 25}, 2)
        spec: dict[str, Any] = {"connection_string": hub.connection_string(FILTER, transport), "patches": 1}
        spec |= {"report": {"ok": True}, "methods": 1} | hub.reach(transport)
        async with driver(node, tmp_path, transport, "module", rig.ca.ca_pem, **spec) as run:
            assert await run.event() == {"event": "connected"}
            twin = await run.event()
            assert twin["desired"] == {"threshold": 25, "$version": 2}
            assert await run.event() == {"event": "reported"}
            assert await run.event() == {"event": "ready", "desired": {"threshold": 25, "$version": 2}}
            rig.hub.set_module_desired("filter", {"threshold": 30, "unit": "C"}, 3)
            assert await run.event() == {"event": "desired", "patch": {"threshold": 30, "unit": "C", "$version": 3}}
            result = await invoke_until_listening(rig, FILTER, MethodCall("echo", b"[1, 2]", timeout_s=10))
            assert await run.event() == {"event": "method", "name": "echo", "payload": [1, 2]}
            assert (result.status, json.loads(result.payload)) == (200, {"echo": [1, 2]})
            assert await run.event() == {"event": "done"}
            assert await run.exit_code() == 0
        assert (await rig.hub.get_twin(FILTER))["reported"] == {"ok": True, "$version": 2}


@pytest.mark.parametrize("transport", ["amqp", "amqp-ws"])
async def test_node_sdk_over_amqp_abandons_a_c2d_message_that_comes_again_and_rejects_one_that_is_dead_lettered(
    tmp_path: Path, node: str, transport: str
) -> None:
    # AMQP only: IoT Hub's MQTT has no abandon or reject (the SDK refuses them there). An abandoned message comes
    # again after the retry wait: a short one here.
    async with hub_with_every_head(tmp_path, QUICK_RETRY) as hub:
        rig = hub.rig
        spec: dict[str, Any] = {"connection_string": hub.connection_string(DEV, transport), "c2d": 3}
        spec |= {"c2d_outcomes": {"bad": ["reject"], "again": ["abandon", "complete"]}} | hub.reach(transport)
        async with driver(node, tmp_path, transport, "device", rig.ca.ca_pem, **spec) as run:
            assert await run.event() == {"event": "connected"}
            assert (await run.event())["event"] == "twin"
            assert await run.event() == {"event": "ready"}
            await rig.hub.cloud_to_device("dev1", Message(b"1", system_properties={"messageId": "bad"}))
            await rig.hub.cloud_to_device("dev1", Message(b"2", system_properties={"messageId": "again"}))
            got = [await run.event() for _ in range(3)]
            assert [(e["message_id"], e["outcome"]) for e in got] == [
                ("bad", "reject"),
                ("again", "abandon"),
                ("again", "complete"),  # delivered again after the executor's retry wait
            ]
            assert await run.event() == {"event": "done"}
            assert await run.exit_code() == 0
        endpoint = device_endpoint("dev1")
        [queue] = rig.store.queues(endpoint)
        executor = rig.hub.executors[endpoint]
        async with asyncio.timeout(STEP_S):
            await executor.wait_for(lambda: rig.store.checkpoint(queue).committed >= 1)
        [dead] = rig.store.dead_letters(endpoint)
        assert dead.message.body == b"1"
        assert "rejected by the client" in (dead.error or "")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_node_sdk_device_with_a_bad_key_is_refused_at_connect(tmp_path: Path, node: str, transport: str) -> None:
    async with hub_with_every_head(tmp_path) as hub:
        rig = hub.rig
        cs = ConnectionString.parse(hub.connection_string(DEV, transport))
        wrong = dataclasses.replace(cs, shared_access_key=KEYS[FILTER.id]).format()
        spec = {"connection_string": wrong} | hub.reach(transport)
        async with driver(node, tmp_path, transport, "device", rig.ca.ca_pem, **spec) as run:
            event = await run.event(error_expected=True)
            assert await run.exit_code() == 1
        assert event["event"] == "error"
        assert event["type"] == "UnauthorizedError"  # the SDK's own error for a refused login, either transport
        assert rig.hub.client_connects.count("dev1") == 0
        assert stored(rig, "$upstream") == []


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_node_sdk_device_against_edgehub_run_with_the_cloud_on_its_upstream(
    tmp_path: Path, node: str, transport: str
) -> None:
    """``edgehub run`` as a user runs it, its upstream a Mosquitto playing the cloud: the cloud's direct method
    call and cloud-to-device message reach the SDK over the transport, with the connection string ``edgehub identity
    add`` printed (its gateway given the port the hub took; for a WebSocket transport, the proxy to its ``wss``
    port)."""
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": ROUTES}))
    printed = await identity_add(data, "dev1")
    async with MosquittoPeer(tmp_path) as broker, ConnectProxy({}) as proxy:
        cloud = Paho.make("cloud")
        assert await cloud.connect(broker.port) == 0
        cloud.client.subscribe("$iothub/dev1/methods/res/#", qos=0)
        upstream = ["--upstream-mqtt", f"127.0.0.1:{broker.port}", "--upstream-wire", "message"]
        proc, mqtts, lines = await start(data, manifest, *upstream)
        try:
            ports = {"amqp": amqps_port(lines), "mqtt": mqtts, "wss": wss_port(lines)}  # wss: EDGEHUB_WSS_PORT=0
            proxy.routes[("127.0.0.1", WSS_PORT)] = ("127.0.0.1", ports["wss"])
            cs = dataclasses.replace(printed, gateway_host_name=gateway(transport, ports)).format()
            spec: dict[str, Any] = {"connection_string": cs, "messages": [{"data": "{}", "message_id": "r-1"}]}
            spec |= {"report": {"run": True}, "c2d": 1, "methods": 1} | through_proxy(transport, proxy)
            async with driver(node, tmp_path, transport, "device", data / "certs" / "ca.pem", **spec) as run:
                assert await run.event() == {"event": "connected"}
                assert await run.event() == {"event": "sent", "index": 0}
                assert (await run.event())["event"] == "twin"
                assert await run.event() == {"event": "reported"}
                assert await run.event() == {"event": "ready"}
                # The upstream subscribes for dev1 once connected, which may come after the hub is ready, and the
                # SDK attaches its method links in the background: a call unanswered within a second is made again.
                # Answered 404 (not attached yet): asked again a little later. Bounded by STEP_S.
                async with asyncio.timeout(STEP_S):
                    await cloud.subscribes.get()
                    for rid in itertools.count(1):
                        cloud.publish(f"$iothub/dev1/methods/POST/echo/?$rid={rid}&$timeout=5", b'"hi"', qos=0)
                        try:
                            async with asyncio.timeout(1):
                                answer = await cloud.messages.get()
                        except TimeoutError:
                            continue
                        if not answer.topic.startswith("$iothub/dev1/methods/res/404/"):
                            break
                        await asyncio.sleep(0.1)
                assert answer.topic == f"$iothub/dev1/methods/res/200/?$rid={rid}"
                assert json.loads(answer.payload) == {"echo": "hi"}
                assert await run.event() == {"event": "method", "name": "echo", "payload": "hi"}
                cloud.publish("devices/dev1/messages/devicebound/$.mid=c1&cmd=on", b"hello device", qos=1)
                c2d = await run.event()
                assert (c2d["event"], c2d["data"], c2d["message_id"]) == ("c2d", "hello device", "c1")
                assert c2d["outcome"] == "complete"
                assert c2d["properties"]["cmd"] == "on"
                assert await run.event() == {"event": "done"}
                assert await run.exit_code() == 0
            assert proxy.tunnels == (1 if transport in WEBSOCKETS else 0)
        finally:
            await stop(proc)
            await cloud.close()
