"""The Azure IoT device SDK for Python over MQTT over WebSockets (``websockets=True``: port 443, path
``/$iothub/websocket``, subprotocol ``mqtt``), unmodified, against the hub's WebSocket listener: telemetry, a
module's input, its twin (get, reported patch, desired patch), a cloud-to-device message and a direct method.

The SDK dials 443 and has no setting for it: as in ``test_azure_sdk``, an HTTP CONNECT proxy tunnels it to the
hub's free ``wss`` port, and the SDK's port 8883 is not tunnelled at all here, so nothing can pass over plain MQTT.
The first test runs ``edgehub run`` (the tests' ``EDGEHUB_WSS_PORT=0`` gives it a free ``wss`` port); the second
the hub in the test's loop with a real Mosquitto as the cloud (``cloud_served``), so that it can wait until the
cloud's subscriptions are in before the cloud publishes."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from edgehub.testing.peers import MosquittoPeer
from protocol_heads.websocket import SUBPROTOCOL_MQTT, WebSocketServer, WebSocketSettings
from tests.e2e.conftest import DEV, FILTER, Rig
from tests.e2e.test_azure_sdk import (
    GATEWAY,
    SDK_PORT,
    Sdk,
    cloud_served,
    connection_string,
    edgehub_cli,
    edgehub_run,
    hub_for,
    sdk,
    sdk_python,
    upstream_to,
)

pytestmark = [pytest.mark.interop, pytest.mark.timeout(150)]

__all__ = ["sdk", "sdk_python"]  # the fixtures, used by name

ROUTE = "FROM /messages/* WHERE $connectionDeviceId = 'dev1' INTO BrokeredEndpoint('/modules/f/inputs/in')"


def write(manifest: Path, version: int, desired: dict[str, Any]) -> None:
    content = {
        "$edgeHub": {"properties.desired": {"schemaVersion": "1.1", "$version": version, "routes": {"toF": ROUTE}}},
        "f": {"properties.desired": desired},
    }
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps({"modulesContent": content}))
    os.replace(tmp, manifest)


def websockets_only(sdk: Sdk) -> None:
    """Take the SDK's port 8883 out of the proxy: a client that did not use its WebSocket gets 403."""
    for name in (GATEWAY, "localhost"):
        sdk.proxy.routes.pop((name, SDK_PORT), None)


async def test_sdk_clients_over_websockets_send_receive_and_keep_their_twin_with_edgehub_run(
    tmp_path: Path, sdk: Sdk
) -> None:
    data, manifest = tmp_path / "data", tmp_path / "manifest.json"
    write(manifest, 1, {"threshold": 25})
    device = await edgehub_cli("identity", "add", "dev1", "--data-dir", str(data))
    module = await edgehub_cli("identity", "add", "edge", "--module", "f", "--data-dir", str(data))
    message = {"data": "over a websocket", "message_id": "ws-1", "custom_properties": {"k": "v"}}
    async with edgehub_run(sdk, data, manifest, tmp_path / "edgehub-run.log"):
        websockets_only(sdk)
        assert {port for (_, port) in sdk.proxy.routes} == {443}
        ca = data / "certs" / "ca.pem"
        async with sdk.run("receive", ca, module, count=1, websockets=True) as receiver:
            assert await receiver.event() == {"event": "ready"}
            async with sdk.run("send", ca, device, messages=[message], websockets=True) as sender:
                assert await sender.event() == {"event": "sent", "index": 0}  # its PUBACK: stored
                assert await sender.event() == {"event": "done"}
            got = await receiver.event()
            assert await receiver.event() == {"event": "done"}
        assert got["input_name"] == "in"
        assert got["data"] == "over a websocket"
        assert got["message_id"] == "ws-1"

        async with sdk.run("twin", ca, module, patches=1, report={"applied": 25}, websockets=True) as twin:
            first = await twin.event()
            assert first["event"] == "twin"
            assert first["desired"]["threshold"] == 25
            assert await twin.event() == {"event": "reported"}
            assert await twin.event() == {"event": "ready"}
            write(manifest, 2, {"threshold": 30})  # the hub pushes the change to the connected module
            patch = await twin.event()
            assert patch["event"] == "patch"
            assert patch["patch"]["threshold"] == 30
            assert await twin.event() == {"event": "done"}
        async with sdk.run("twin", ca, module, websockets=True) as again:
            second = await again.event()
        assert second["reported"]["applied"] == 25  # the reported patch was kept


@asynccontextmanager
async def websockets_for(sdk: Sdk, rig: Rig) -> AsyncIterator[WebSocketServer]:
    """A WebSocket listener with TLS (the rig's CA) in front of the rig's MQTT head; the SDK's 443 goes to it."""
    pair = rig.ca.server()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.cert, pair.key)
    settings = WebSocketSettings(tls_port=0, ssl_context=context)
    async with WebSocketServer(rig.hub, settings=settings, heads={SUBPROTOCOL_MQTT: rig.server}) as ws:
        sdk.websockets_at(ws.ports["wss"])
        websockets_only(sdk)
        yield ws


async def test_sdk_over_websockets_gets_a_cloud_to_device_message_and_answers_a_direct_method(
    tmp_path: Path, sdk: Sdk, broker: MosquittoPeer
) -> None:
    upstream = upstream_to(broker)
    try:
        async with (
            hub_for(sdk, tmp_path, [upstream]) as rig,
            websockets_for(sdk, rig),
            cloud_served(rig, upstream, broker) as cloud,
        ):
            async with sdk.run("receive", rig.ca.ca_pem, connection_string(DEV), count=1, websockets=True) as device:
                assert await device.event() == {"event": "ready"}  # connected and subscribed
                cloud.publish("devices/dev1/messages/devicebound/$.mid=c2d-ws&unit=%C2%B0C", b'{"fan": "on"}', qos=1)
                got = await device.event()
                assert await device.event() == {"event": "done"}
            assert got["input_name"] is None  # a cloud-to-device message
            assert got["data"] == '{"fan": "on"}'
            assert got["message_id"] == "c2d-ws"
            assert got["custom_properties"] == {"unit": "°C"}

            run = sdk.run("methods", rig.ca.ca_pem, connection_string(FILTER), count=1, status=200, websockets=True)
            async with run as module:
                assert await module.event() == {"event": "ready"}
                cloud.publish("$iothub/edge/filter/methods/POST/setRate/?$rid=7&$timeout=20", b'{"hz": 2}', qos=1)
                assert await module.event() == {"event": "method", "name": "setRate", "payload": {"hz": 2}}
                async with asyncio.timeout(30):
                    answer = await cloud.messages.get()
                assert await module.event() == {"event": "done"}
            assert answer.topic == "$iothub/edge/filter/methods/res/200/?$rid=7"
            assert json.loads(answer.payload) == {"answer": "setRate", "request": {"hz": 2}}
    finally:
        await upstream.close()
