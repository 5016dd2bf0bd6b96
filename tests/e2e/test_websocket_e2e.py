"""``edgehub run`` serving both protocols over WebSockets (its ``wss`` port, free in tests through
``EDGEHUB_WSS_PORT=0``): a device sends over AMQP over a WebSocket (azure-eventhub's pyamqp on its WebSocket
transport), a route takes it to a module's input, and the module receives it over MQTT over a WebSocket (paho)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from azure.eventhub._pyamqp.message import Message, Properties

from protocol_heads.websocket import IOTHUB_PATH
from tests.e2e.hub_process import identity_add, start, stop
from tests.interop.protocol_heads.amqp.pyamqp_client import pyamqp_sender
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

EXPIRY = int(time.time()) + 86_400


def wss_port(lines: list[str]) -> int:
    for line in lines:
        if m := re.search(r"wss 127\.0\.0\.1:(\d+)", line):
            return int(m.group(1))
    raise AssertionError(f"no wss listener in {lines}")


async def test_a_device_over_amqp_websockets_reaches_a_module_over_mqtt_websockets_with_edgehub_run(
    tmp_path: Path,
) -> None:
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    route = "FROM /messages/* WHERE $connectionDeviceId = 'dev1' INTO BrokeredEndpoint('/modules/f/inputs/in')"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"toF": route}}))
    device = await identity_add(data, "dev1")
    module = await identity_add(data, "edge", "--module", "f")
    proc, _, lines = await start(data, manifest)
    ca = data / "certs" / "ca.pem"
    port = wss_port(lines)
    receiver = Paho.make("edge/f", websocket_path=IOTHUB_PATH)
    user = f"{module.host_name}/edge/f/?api-version=2021-04-12"
    try:
        assert await receiver.connect(port, tls_ca=ca, user=user, password=module.sas_token(EXPIRY)) == 0
        receiver.client.subscribe("devices/edge/modules/f/inputs/#", qos=1)
        async with asyncio.timeout(10):
            assert await receiver.subscribes.get() == [1]

        sender = pyamqp_sender(
            port,
            ca,
            device.sas_token(EXPIRY),
            host_name=device.host_name,
            device_id=device.device_id,
            websocket=True,
            expires_on=EXPIRY,
        )

        def send() -> None:
            sender.open()
            try:
                message = Message(data=[b'{"t": 7}'], properties=Properties(message_id="amqp-ws-1"))
                sender.send_message(message, timeout=10)  # returns on the accepted outcome: stored
            finally:
                sender.close()

        await asyncio.wait_for(asyncio.to_thread(send), 30)
        async with asyncio.timeout(20):
            got = await receiver.messages.get()
        # its message id (set over AMQP) and the device it came from, in the module input's property bag
        assert got.topic == "devices/edge/modules/f/inputs/in/$.mid=amqp-ws-1&$.cdid=dev1"
        assert got.payload == b'{"t": 7}'
    finally:
        await receiver.close()
        await stop(proc)
