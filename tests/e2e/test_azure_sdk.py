"""The Azure IoT device SDK for Python (``azure-iot-device``) against the real hub: RocksDB store in tmp_path,
real routes, the MQTT head over TLS.

The SDK pins ``paho-mqtt<2`` and the project uses 2.x, so it lives in its own venv (``.venv-azure-sdk``, made
by ``make test``; another one can be named with ``EDGEHUB_AZURE_SDK_VENV``) and runs as a subprocess: the
driver ``azure_sdk_driver.py`` does one scenario and reports on stdout, one JSON object a line. A missing venv
fails these tests; it never skips them.

The SDK always dials port 8883 and has no setting for it, so it goes through an HTTP CONNECT proxy
(``edgehub.testing.connect_proxy``, which the SDK supports through ``ProxyOptions`` as its users behind a
corporate proxy use it): the SDK asks for the gateway's port 8883 and the proxy tunnels it to the port the hub
really listens on, a free one, so a hub left running on 8883 (``make run``) breaks nothing. The hub runs in
the test's event loop (so that a test can look into its store the moment the SDK reports a PUBACK), with
connection strings made as ``edgehub identity add`` makes them: ``HostName`` is the hub's IoT Hub name (the
SAS token's resource), ``GatewayHostName`` the address the SDK dials, 127.0.0.1, which the test server
certificate's SAN holds. The last test takes the strings ``edgehub identity add`` prints, as they are, to an
``edgehub run`` process on its defaults but for the ports (free ones).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgehub.core import Identity
from edgehub.core.sas import ConnectionString
from edgehub.delivery import Endpoint
from edgehub.store import QueueId, StoredItem
from edgehub.testing.connect_proxy import ConnectProxy
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, WireMode
from edgehub.upstream.mqtt.transport import MqttUpstream
from tests.e2e.conftest import DEV, FILTER, HOST, KEYS, SENSOR, Rig, running_hub
from tests.e2e.driver_process import DriverRun, driver_process
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

REPO = Path(__file__).resolve().parents[2]
SDK_VENV = Path(os.environ.get("EDGEHUB_AZURE_SDK_VENV", REPO / ".venv-azure-sdk"))
DRIVER = Path(__file__).with_name("azure_sdk_driver.py")
EDGEHUB = str(Path(sys.executable).parent / "edgehub")
SDK_PORT = 8883  # fixed by the SDK: it has no setting for the port, so it is tunnelled (Sdk.proxy)
SDK_WEBSOCKET_PORT = 443  # likewise over WebSockets (websockets=True)
GATEWAY = "127.0.0.1"
STEP_S = 30.0  # the longest any one SDK step (start, connect, send, receive) may take

HOT = "/modules/filter/inputs/hot"
FROM_SENSOR = "/modules/filter/inputs/fromsensor"
ROUTES = {
    "all": "FROM /messages/* WHERE $connectionDeviceId = 'dev1' INTO $upstream",
    # Holds only when the content type, encoding and an application property all came through.
    "hot": f"FROM /messages/* WHERE $body.t > 20 AND severity = 'high' INTO BrokeredEndpoint('{HOT}')",
    "m2m": f"FROM /messages/modules/sensor/outputs/out1 INTO BrokeredEndpoint('{FROM_SENSOR}')",
}
# What a careful device sends: every system property the SDK can set, and application properties whose names
# and values need URL encoding in the topic.
CUSTOM = {"severity": "high", "unit": "°C", "a&b=c": "x/y z+1%", "empty": ""}
SECURITY_INTERFACE_ID = "urn:azureiot:Security:SecurityAgent:1"


def connection_string(identity: Identity, key: str | None = None) -> str:
    """What ``edgehub identity add`` prints for ``identity``, dialling GATEWAY."""
    return ConnectionString(
        host_name=HOST,
        device_id=identity.device_id,
        module_id=identity.module_id,
        shared_access_key=key or KEYS[identity.id],
        gateway_host_name=GATEWAY,
    ).format()


class SdkRun(DriverRun):
    """One driver process; ``event()`` reads its next JSON line."""

    STEP_S = STEP_S

    async def event(self) -> dict[str, Any]:
        return await self.next_event()


@dataclass
class Sdk:
    """The SDK's venv, a folder for the drivers' stderr, and the CONNECT proxy every driver dials through."""

    python: Path
    logs: Path
    proxy: ConnectProxy

    def gateway_at(self, port: int) -> None:
        """The SDK's connections to the gateway's port 8883 go to the hub's TLS ``port`` on 127.0.0.1."""
        for name in (GATEWAY, "localhost"):  # what the tests' strings and ``edgehub identity add``'s name
            self.proxy.routes[(name, SDK_PORT)] = ("127.0.0.1", port)

    def websockets_at(self, port: int) -> None:
        """The SDK's WebSocket connections to the gateway's port 443 go to the hub's ``wss`` ``port``."""
        for name in (GATEWAY, "localhost"):
            self.proxy.routes[(name, SDK_WEBSOCKET_PORT)] = ("127.0.0.1", port)

    @asynccontextmanager
    async def run(self, scenario: str, ca: Path, connection: str, **spec: Any) -> AsyncIterator[SdkRun]:
        """Start the driver for ``scenario``, trusting ``ca``, through the proxy; the process is killed if the
        block leaves it running."""
        assert self.proxy.routes, "no gateway to dial: hub_for(sdk, ...) or edgehub_run(sdk, ...) first"
        spec = {
            "connection_string": connection,
            "ca": str(ca),
            "timeout_s": STEP_S,
            "proxy": ["127.0.0.1", self.proxy.port],
        } | spec
        stderr = self.logs / f"sdk-{scenario}-{len(list(self.logs.glob('sdk-*')))}.log"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of ours in the SDK's venv
        async with driver_process([str(self.python), str(DRIVER), scenario, json.dumps(spec)], stderr, env) as proc:
            yield SdkRun(proc, stderr)


@pytest.fixture(scope="session")
def sdk_python() -> Path:
    python = SDK_VENV / "bin" / "python"
    hint = "`make sdk-venv` makes .venv-azure-sdk (or set EDGEHUB_AZURE_SDK_VENV to a venv that has the SDK)"
    if not python.exists():
        pytest.fail(f"the Azure IoT device SDK venv is missing: no {python}; {hint}", pytrace=False)
    probe = subprocess.run(
        [str(python), "-c", "import azure.iot.device"], capture_output=True, text=True, timeout=60, check=False
    )
    if probe.returncode != 0:
        pytest.fail(f"{python} cannot import azure.iot.device: {probe.stderr.strip()}; {hint}", pytrace=False)
    return python


@pytest.fixture
async def sdk(sdk_python: Path, tmp_path: Path) -> AsyncIterator[Sdk]:
    async with ConnectProxy({}) as proxy:
        yield Sdk(sdk_python, tmp_path, proxy)


@asynccontextmanager
async def hub_for(sdk: Sdk, data: Path, endpoints: Sequence[Endpoint] = ()) -> AsyncIterator[Rig]:
    """The real hub (``running_hub``) with TLS on a free port, which the SDK's 8883 is tunnelled to."""
    async with running_hub(data, routes=ROUTES, endpoints=endpoints) as rig:
        sdk.gateway_at(rig.tls)
        yield rig


def stored(rig: Rig, endpoint: str) -> list[StoredItem]:
    return [item for q in rig.store.queues(endpoint) for item in rig.store.read(q, 0, 100)]


def queue_of(rig: Rig, endpoint: str) -> QueueId:
    [queue] = rig.store.queues(endpoint)
    return queue


async def test_sdk_device_telemetry_arrives_stored_and_routed_with_every_property_intact(
    tmp_path: Path, sdk: Sdk
) -> None:
    messages = [
        {
            "data": '{"t": 21.5}',
            "message_id": "m-1",
            "correlation_id": "c-1",
            "user_id": "operator",
            "content_type": "application/json",
            "content_encoding": "utf-8",
            "custom_properties": CUSTOM,
        },
        {"data": '{"t": 30}', "message_id": "m-2", "content_type": "application/json", "content_encoding": "utf-8"},
        {"data": "{}", "message_id": "sec-1", "security": True},
    ]
    async with (
        hub_for(sdk, tmp_path) as rig,
        sdk.run("send", rig.ca.ca_pem, connection_string(DEV), messages=messages) as run,
    ):
        for i in range(len(messages)):
            assert await run.event() == {"event": "sent", "index": i}
            # send_message returned, so the SDK had its PUBACK: the message must be durable by now.
            assert len(stored(rig, "$upstream")) == i + 1
        assert await run.event() == {"event": "done"}
        assert await run.exit_code() == 0
        first, second, security = (item.message for item in stored(rig, "$upstream"))
        assert first.body == b'{"t": 21.5}'
        assert first.properties == CUSTOM
        sp = first.system_properties
        assert sp["messageId"] == "m-1"
        assert sp["cid"] == "c-1"
        assert sp["userId"] == "operator"
        assert sp["contentType"] == "application/json"
        assert sp["contentEncoding"] == "utf-8"
        assert sp["connectionDeviceId"] == "dev1"
        assert sp["connectionAuthMethod"] == "sas"
        assert "connectionModuleId" not in sp
        assert second.properties == {}
        assert second.system_properties["messageId"] == "m-2"
        # The SDK marks a security message with $.ifid: IoT Hub's iothub-interface-id system property.
        assert security.properties == {}
        assert security.system_properties["iothub-interface-id"] == SECURITY_INTERFACE_ID
        # Only the first holds severity = 'high' and a JSON body the route can read ($body.t needs the content
        # type and encoding).
        assert [item.message.system_properties["messageId"] for item in stored(rig, HOT)] == ["m-1"]


async def test_sdk_module_output_reaches_another_sdk_module_input_through_a_route(tmp_path: Path, sdk: Sdk) -> None:
    messages = [
        {
            "data": f'{{"n": {i}}}',
            "message_id": f"s-{i}",
            "correlation_id": f"req-{i}",
            "content_type": "application/json",
            "content_encoding": "utf-8",
            "custom_properties": {"n": str(i), "unit": "°C", "a&b=c": "x/y z+1%"},
        }
        for i in range(3)
    ]
    async with hub_for(sdk, tmp_path) as rig:
        async with sdk.run("receive", rig.ca.ca_pem, connection_string(FILTER), count=len(messages)) as receiver:
            assert await receiver.event() == {"event": "ready"}  # connected and subscribed to its inputs
            async with sdk.run(
                "send", rig.ca.ca_pem, connection_string(SENSOR), messages=messages, output="out1"
            ) as sender:
                assert [await sender.event() for _ in messages] == [{"event": "sent", "index": i} for i in range(3)]
                assert await sender.event() == {"event": "done"}
                assert await sender.exit_code() == 0
            got = [await receiver.event() for _ in messages]
            assert await receiver.event() == {"event": "done"}
            assert await receiver.exit_code() == 0
        for i, msg in enumerate(got):
            assert msg["event"] == "message"
            assert msg["input_name"] == "fromsensor"
            assert msg["data"] == f'{{"n": {i}}}'
            assert msg["message_id"] == f"s-{i}"
            assert msg["correlation_id"] == f"req-{i}"
            assert msg["content_type"] == "application/json"
            assert msg["content_encoding"] == "utf-8"
            # The SDK files the sender's identity ($.cdid, $.cmid) under custom properties, as it does with
            # Azure IoT Edge's hub; the output name stays the sender's business.
            assert msg["custom_properties"] == {
                "n": str(i),
                "unit": "°C",
                "a&b=c": "x/y z+1%",
                "$.cdid": "edge",
                "$.cmid": "sensor",
            }
        # The receiver's PUBACKs reached the hub: the queue is checkpointed past all three.
        executor = rig.hub.executors[FROM_SENSOR]
        queue = queue_of(rig, FROM_SENSOR)
        async with asyncio.timeout(10):
            await executor.wait_for(lambda: rig.store.checkpoint(queue).committed >= 2)


async def test_sdk_client_with_a_bad_key_is_refused_at_connect(tmp_path: Path, sdk: Sdk) -> None:
    async with hub_for(sdk, tmp_path) as rig:
        async with sdk.run("connect", rig.ca.ca_pem, connection_string(DEV, KEYS[FILTER.id])) as run:
            event = await run.event()
            assert await run.exit_code() == 1
        assert event["event"] == "error"
        assert event["type"] == "CredentialError"
        assert rig.server.connected == []
        assert stored(rig, "$upstream") == []


async def edgehub_cli(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(EDGEHUB, *args, stdout=asyncio.subprocess.PIPE)
    async with asyncio.timeout(STEP_S):
        out, _ = await proc.communicate()
    assert proc.returncode == 0, f"edgehub {' '.join(args)} failed"
    return out.decode().strip()


@asynccontextmanager
async def edgehub_run(sdk: Sdk, data: Path, manifest: Path, log: Path) -> AsyncIterator[None]:
    """``edgehub run`` on its defaults (host name localhost) but for its ports, free ones, with the SDK's 8883
    tunnelled to its TLS port, until the block ends; its stderr goes to ``log`` (a pipe nobody reads could fill
    and stall the hub)."""
    ports = ["--mqtts-port", "0", "--amqps-port", "0", "--admin-port", "0"]
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            EDGEHUB,
            "run",
            "--manifest",
            str(manifest),
            "--data-dir",
            str(data),
            *ports,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(STEP_S):
            while b"; ready" not in (line := await proc.stdout.readline()):
                if not line:
                    await proc.wait()
                    said = await asyncio.to_thread(log.read_text)
                    pytest.fail(f"edgehub run ended early: {said}", pytrace=False)
                if m := re.search(rb"listening: tls 127\.0\.0\.1:(\d+)", line):
                    sdk.gateway_at(int(m.group(1)))
                if m := re.search(rb"wss 127\.0\.0\.1:(\d+)", line):  # the session's EDGEHUB_WSS_PORT=0
                    sdk.websockets_at(int(m.group(1)))
        yield
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(STEP_S):
            await proc.communicate()
    assert proc.returncode == 0, await asyncio.to_thread(log.read_text)


async def test_sdk_clients_log_in_with_what_identity_add_prints_to_edgehub_run_on_its_defaults(
    tmp_path: Path, sdk: Sdk
) -> None:
    data, manifest = tmp_path / "data", tmp_path / "manifest.json"
    route = "FROM /messages/* WHERE $connectionDeviceId = 'dev1' INTO BrokeredEndpoint('/modules/f/inputs/in')"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"toF": route}}))
    device = await edgehub_cli("identity", "add", "dev1", "--data-dir", str(data))
    module = await edgehub_cli("identity", "add", "edge", "--module", "f", "--data-dir", str(data))
    assert "GatewayHostName=localhost" in device
    message = {"data": "hello", "message_id": "cli-1", "custom_properties": {"k": "v"}}
    async with edgehub_run(sdk, data, manifest, tmp_path / "edgehub-run.log"):
        ca = data / "certs" / "ca.pem"  # made by the first start
        async with sdk.run("receive", ca, module, count=1) as receiver:
            assert await receiver.event() == {"event": "ready"}
            async with sdk.run("send", ca, device, messages=[message]) as sender:
                assert await sender.event() == {"event": "sent", "index": 0}
                assert await sender.event() == {"event": "done"}
            got = await receiver.event()
            assert await receiver.event() == {"event": "done"}
    assert got["input_name"] == "in"
    assert got["data"] == "hello"
    assert got["message_id"] == "cli-1"
    assert got["custom_properties"] == {"k": "v", "$.cdid": "dev1"}


# --- cloud-to-device messages and direct methods, with a real Mosquitto as the cloud ---------------------------


@asynccontextmanager
async def cloud_served(rig: Rig, upstream: MqttUpstream, broker: MosquittoPeer) -> AsyncIterator[Paho]:
    """``upstream`` serving ``rig``'s hub (subscribed for its devices), and a paho client on the broker as the
    cloud, subscribed to the method responses."""
    await upstream.start()
    async with asyncio.timeout(STEP_S):
        await upstream.wait_connected()
        upstream.serve_cloud(rig.hub)
        await upstream.wait_cloud_ready()
    cloud = Paho.make("cloud")
    assert await cloud.connect(broker.port) == 0
    cloud.client.subscribe("$iothub/+/+/methods/res/#", qos=0)
    async with asyncio.timeout(STEP_S):
        await cloud.subscribes.get()
    try:
        yield cloud
    finally:
        await cloud.close()


def upstream_to(broker: MosquittoPeer) -> MqttUpstream:
    settings = MqttUpstreamSettings(
        host=broker.host, port=broker.port, client_id="gw", hub_id="gw", wire_mode=WireMode.MESSAGE
    )
    return MqttUpstream(settings)


async def test_sdk_device_receives_a_c2d_message_sent_while_it_was_offline_after_the_hub_restarted(
    tmp_path: Path, sdk: Sdk, broker: MosquittoPeer
) -> None:
    upstream = upstream_to(broker)
    try:
        async with hub_for(sdk, tmp_path, [upstream]) as rig, cloud_served(rig, upstream, broker) as cloud:
            topic = "devices/dev1/messages/devicebound/$.mid=c2d-1&$.cid=req-9&unit=%C2%B0C&a%26b%3Dc=x%2Fy%20z"
            mid = cloud.publish(topic, b'{"fan": "on"}', qos=1)
            async with asyncio.timeout(STEP_S):
                assert await cloud.publishes.get() == (mid, 0)  # the broker has it
                await rig.hub.c2d.wait_accepted(1)  # and the hub, durably
    finally:
        await upstream.close()
    async with (
        hub_for(sdk, tmp_path) as rig,
        sdk.run("receive", rig.ca.ca_pem, connection_string(DEV), count=1) as receiver,
    ):
        assert await receiver.event() == {"event": "ready"}
        got = await receiver.event()
        assert await receiver.event() == {"event": "done"}
        assert await receiver.exit_code() == 0
    assert got["event"] == "message"
    assert got["input_name"] is None  # a cloud-to-device message, not a module input
    assert got["data"] == '{"fan": "on"}'
    assert got["message_id"] == "c2d-1"
    assert got["correlation_id"] == "req-9"
    assert got["custom_properties"] == {"unit": "°C", "a&b=c": "x/y z"}


async def test_sdk_module_answers_a_method_from_the_cloud_and_a_call_while_it_is_offline_gets_404(
    tmp_path: Path, sdk: Sdk, broker: MosquittoPeer
) -> None:
    upstream = upstream_to(broker)
    try:
        async with hub_for(sdk, tmp_path, [upstream]) as rig, cloud_served(rig, upstream, broker) as cloud:
            cloud.publish("$iothub/edge/filter/methods/POST/setRate/?$rid=1&$timeout=10", b'{"hz": 5}', qos=0)
            async with asyncio.timeout(10):  # the call's timeout: a 404 comes before it, at once
                away = await cloud.messages.get()
            assert away.topic == "$iothub/edge/filter/methods/res/404/?$rid=1"
            assert json.loads(away.payload)["errorCode"] == 404103
            async with sdk.run("methods", rig.ca.ca_pem, connection_string(FILTER), count=1, status=201) as module:
                assert await module.event() == {"event": "ready"}  # connected and subscribed to its methods
                cloud.publish("$iothub/edge/filter/methods/POST/setRate/?$rid=2&$timeout=20", b'{"hz": 5}', qos=1)
                assert await module.event() == {"event": "method", "name": "setRate", "payload": {"hz": 5}}
                async with asyncio.timeout(STEP_S):
                    answer = await cloud.messages.get()
                assert await module.event() == {"event": "done"}
                assert await module.exit_code() == 0
            assert answer.topic == "$iothub/edge/filter/methods/res/201/?$rid=2"
            assert json.loads(answer.payload) == {"answer": "setRate", "request": {"hz": 5}}
            assert stored(rig, "$upstream") == []  # the module's answer was never routed as telemetry
    finally:
        await upstream.close()
