"""The heads read no more than the deployment allows, as ``edgehub run`` composes them (``serve``, in the test's
loop): with the default ``maxMessageSizeBytes`` (256 KiB) a 300 KiB MQTT PUBLISH and a 300 KiB AMQP transfer are
refused at the head (DISCONNECT 0x95, over TCP and over a WebSocket; the link closed with
``amqp:link:message-size-exceeded``), MQTT's from the packet's header before the client has sent its body, AMQP's
within a frame of the bound, one refusal line naming the peer and the bound; once the admin API
raises the limit to 512 KiB, a NEW connection (a new link) is told the new bound and its 300 KiB is stored, while
one opened before keeps the bound it was given; a lowered limit applies at once, through the store."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.enums import MQTTProtocolVersion
from proton import Message as AmqpMessage
from proton.utils import LinkDetached, SendException

from edgehub.core.message_size import MAX_MESSAGE_SIZE_BYTES, read_bound_bytes
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import MQTT_50, ConnAck, Connect, Disconnect, PropertyId, PubAck, Publish, ReasonCode
from edgehub.runtime.admin.client import AdminClient, running_hub
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.store import open_identities, open_store
from tests.e2e.serving import serving
from tests.protocol_heads.amqp.conftest import ProtonClient, sas_token
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, Paho, sas_password, username
from tests.protocol_heads.mqtt.rawclient import RawClient

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

EXPIRY = int(time.time()) + 86_400  # within the hub's maximum token lifetime
KIB = 1024
BIG = b"x" * (300 * KIB)  # over the default limit (256 KiB), under the raised one
TOPIC = "devices/dev1/messages/events/"
BIG_PUBLISH = encode(Publish(TOPIC, BIG, 1, packet_id=1), MQTT_50)  # 38 bytes of framing around it
DEFAULT_BOUND = read_bound_bytes(256 * KIB)  # 264 KiB: the limit and the framing envelope
RAISED_BOUND = read_bound_bytes(512 * KIB)
FRAME = 64 * KIB  # the AMQP head's max-frame-size
ADDRESS = "/devices/dev1/messages/events"


@dataclass
class Hub:
    ports: dict[str, int]
    admin: AdminClient

    async def set_limit(self, size_bytes: int) -> None:
        patch = {"delivery": {"queuePolicy": {"maxMessageSizeBytes": size_bytes}}}
        code, _ = await asyncio.to_thread(self.admin.request, "PATCH", "/twin/desired", patch)
        assert code == 200

    async def stored(self) -> tuple[int, int]:
        """(messages, bytes) the store holds (routed to ``$upstream``, which has no transport: they stay)."""
        _, status = await asyncio.to_thread(self.admin.request, "GET", "/status")
        assert isinstance(status, dict)
        store: dict[str, Any] = status["store"]
        return store["messages"], store["bytes"]


@asynccontextmanager
async def hub_running(tmp_path: Path) -> AsyncIterator[Hub]:
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}))
    store = open_store(data)
    await open_identities(store, HOST, data_dir=data).add_symmetric_key(DEV, DEVICE_KEY)
    await store.close()
    config = HubConfig(
        manifest=manifest,
        data_dir=data,
        host_name=HOST,
        mqtt_port=0,
        mqtts_port=None,
        amqp_port=0,
        ws_port=0,
        admin_port=0,
    )
    async with serving(config, timeout_s=30) as ports:
        admin = await asyncio.to_thread(running_hub, data)
        assert admin is not None
        yield Hub(ports, admin)


async def mqtt_login(port: int) -> tuple[RawClient, int]:
    """A logged-in MQTT 5 device and the Maximum Packet Size its CONNACK announced."""
    client = await RawClient.open(port, level=MQTT_50)
    connect = Connect(
        "dev1",
        protocol_level=MQTT_50,
        username=username(DEV),
        password=sas_password(DEV, DEVICE_KEY, expiry_s=EXPIRY).encode(),
    )
    ack = await client.login(connect)
    assert isinstance(ack, ConnAck)
    assert ack.reason_code == 0
    announced = ack.properties.values[PropertyId.MAXIMUM_PACKET_SIZE]
    assert isinstance(announced, int)
    return client, announced


async def refused_from_its_header(client: RawClient) -> int:
    """Send a 300 KiB PUBLISH's first 2 KiB only: the reason code of the DISCONNECT the head answers it with, and
    closes (so the head refused the packet from its header, never holding its body)."""
    client.send_raw(BIG_PUBLISH[: 2 * KIB])
    answer = await client.next()
    assert isinstance(answer, Disconnect), answer
    assert await client.closed_by_server()
    await client.close()
    return answer.reason_code


async def amqp_device(port: int) -> ProtonClient:
    return await ProtonClient.connect(
        port, user=f"dev1@sas.{HOST}", password=sas_token(DEV, DEVICE_KEY, expiry_s=EXPIRY)
    )


def refusal_lines(caplog: pytest.LogCaptureFixture, reason: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"refused reason={reason} ")]


async def test_a_message_over_the_deployment_limit_is_refused_at_the_head_and_a_raise_reaches_new_connections(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "protocol_heads")
    async with hub_running(tmp_path) as hub:
        mqtt_port, amqp_port = hub.ports["tcp"], hub.ports["amqp"]

        # 1. The default deployment (256 KiB): MQTT is told 264 KiB and refuses more from the packet's header.
        client, announced = await mqtt_login(mqtt_port)
        assert announced == DEFAULT_BOUND == 264 * KIB
        assert await refused_from_its_header(client) == ReasonCode.PACKET_TOO_LARGE
        (line,) = refusal_lines(caplog, "packet_too_large")
        assert line.startswith("refused reason=packet_too_large peer=127.0.0.1 client=dev1 "), line
        said = f"code=0x95 detail='packet of {len(BIG_PUBLISH)} bytes is over the limit of {DEFAULT_BOUND}'"
        assert said in line, line
        # paho, as a device sends it whole: DISCONNECT 0x95 rather than a PUBACK.
        paho = Paho.make("dev1", protocol=MQTTProtocolVersion.MQTTv5)
        assert (
            await paho.connect(mqtt_port, user=username(DEV), password=sas_password(DEV, DEVICE_KEY, expiry_s=EXPIRY))
            == 0
        )
        paho.publish(TOPIC, BIG)
        async with asyncio.timeout(20):
            reason = await paho.disconnects.get()
        assert reason.value == ReasonCode.PACKET_TOO_LARGE
        await paho.close()
        # The same over a WebSocket: once upgraded, the connection is the MQTT head's, its bound too.
        paho = Paho.make("dev1", protocol=MQTTProtocolVersion.MQTTv5, websocket_path="/$iothub/websocket")
        password = sas_password(DEV, DEVICE_KEY, expiry_s=EXPIRY)
        assert await paho.connect(hub.ports["ws"], user=username(DEV), password=password) == 0
        paho.publish(TOPIC, BIG)
        async with asyncio.timeout(20):
            reason = await paho.disconnects.get()
        assert reason.value == ReasonCode.PACKET_TOO_LARGE
        await paho.close()

        # AMQP: the link is told 264 KiB at attach and closed with message-size-exceeded past it, at most a frame
        # (64 KiB, the hub's max-frame-size) later: a 1 MiB message is never held whole.
        for n, body in enumerate((BIG, b"x" * MAX_MESSAGE_SIZE_BYTES), start=1):
            amqp = await amqp_device(amqp_port)
            try:
                sender = await amqp.sender(ADDRESS)
                assert sender.link.remote_max_message_size == DEFAULT_BOUND
                with pytest.raises((LinkDetached, SendException)) as info:
                    await amqp.send(sender, AmqpMessage(body=body))
                if isinstance(info.value, LinkDetached):
                    assert "message-size-exceeded" in str(info.value)
            finally:
                await amqp.close()
            lines = refusal_lines(caplog, "too_large")
            assert len(lines) == n, lines
            assert lines[-1].startswith("refused reason=too_large peer=127.0.0.1 client=dev1 "), lines
            read = re.fullmatch(rf".* size=(\d+) limit={DEFAULT_BOUND}", lines[-1])
            assert read is not None, lines
            assert int(read[1]) <= DEFAULT_BOUND + FRAME, lines
        assert await hub.stored() == (0, 0)  # nothing got as far as the store

        # 2. Connections opened before the raise keep the bound they were given (and announced).
        kept, _ = await mqtt_login(mqtt_port)
        kept_amqp = await amqp_device(amqp_port)
        try:
            kept_link = await kept_amqp.sender(ADDRESS)
            await hub.set_limit(512 * KIB)
            assert await refused_from_its_header(kept) == ReasonCode.PACKET_TOO_LARGE
            assert kept_link.link.remote_max_message_size == DEFAULT_BOUND
            # A new link, even on a connection opened before, takes the bound as it is now.
            new_link = await kept_amqp.sender(ADDRESS, name="after-the-raise")
            assert new_link.link.remote_max_message_size == RAISED_BOUND
            await kept_amqp.send(new_link, AmqpMessage(body=BIG))
        finally:
            await kept_amqp.close()
        assert (await hub.stored())[0] == 1

        # 3. A new MQTT connection is told the raised bound, and its 300 KiB is stored.
        client, announced = await mqtt_login(mqtt_port)
        assert announced == RAISED_BOUND == 520 * KIB
        client.send(Publish(TOPIC, BIG, 1, packet_id=1))
        assert await client.next() == PubAck(1)
        messages, stored_bytes = await hub.stored()
        assert messages == 2
        assert stored_bytes >= 2 * len(BIG)

        # 4. Lowered again: at once, through the store, on the connection that was told 520 KiB.
        await hub.set_limit(256 * KIB)
        client.send(Publish(TOPIC, BIG, 1, packet_id=2))
        refused = await client.next()
        assert isinstance(refused, PubAck)
        assert (refused.packet_id, refused.reason_code) == (2, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
        await client.close()
        assert (await hub.stored())[0] == 2
