"""Manifest keys that take effect, as an operator meets them with ``edgehub run``: the admin API raises
``maxMessageSizeBytes`` and a message over the old limit goes through over MQTT and AMQP, live; the cloud's twin
(Mosquitto, ``CloudTwinService``) changes ``upstream.partitions``, which is reported as needing a restart, and the
restart runs it (the manifest file is unchanged since); a file edited while the hub was stopped wins at the next
start. Every key, one by one: ``tests/runtime/deployment/test_every_key.py``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.enums import MQTTProtocolVersion
from proton import Message as AmqpMessage
from proton.utils import LinkDetached, SendException

from edgehub.core.message_size import MAX_MESSAGE_SIZE_BYTES
from edgehub.core.sas import ConnectionString
from edgehub.mqtt.packets import ReasonCode
from edgehub.runtime.admin.client import AdminClient, running_hub
from edgehub.testing.cloud_twin import CloudTwinService
from edgehub.testing.peers import MosquittoPeer
from tests.e2e.hub_process import EDGEHUB, identity_add, start, stop
from tests.e2e.test_amqp_e2e import amqp_client, amqps_port
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

TOKEN_EXPIRY = int(time.time()) + 86_400
BIG = b"x" * (300 * 1024)  # over the default limit (256 KiB), under the one the admin API sets
ROUTES = {"up": "FROM /messages/* INTO $upstream"}


def write_manifest(path: Path, desired: dict[str, Any]) -> None:
    path.write_text(json.dumps({"modulesContent": {"$edgeHub": {"properties.desired": desired}}}))


async def admin(data: Path) -> AdminClient:
    client = await asyncio.to_thread(running_hub, data)
    assert client is not None
    return client


async def reported(client: AdminClient) -> dict[str, Any]:
    _, body = await asyncio.to_thread(client.request, "GET", "/twin/reported")
    assert isinstance(body, dict)
    return body


async def mqtt_publish(port: int, ca: Path, cs: ConnectionString, body: bytes) -> int:
    """One QoS 1 message from an MQTT 5 device on a new connection (a raised limit reaches a client at its next
    connection); the PUBACK's reason code, or the DISCONNECT's when the head refused the packet (0x95: over the
    bound the connection was told)."""
    dev = Paho.make("dev1", protocol=MQTTProtocolVersion.MQTTv5)
    user = f"{cs.host_name}/dev1/?api-version=2021-04-12"
    assert await dev.connect(port, tls_ca=ca, user=user, password=cs.sas_token(TOKEN_EXPIRY)) == 0
    try:
        mid = dev.publish("devices/dev1/messages/events/", body)
        async with asyncio.timeout(20):
            acked = asyncio.ensure_future(dev.publishes.get())
            gone = asyncio.ensure_future(dev.disconnects.get())
            done, pending = await asyncio.wait({acked, gone}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if gone in done:  # paho has let go of the connection (its on_disconnect said so)
            return int(gone.result().value)
        got, code = acked.result()
        assert got == mid
        return int(code)
    finally:
        await dev.close()


async def amqp_accepted(port: int, data: Path, cs: ConnectionString, body: bytes) -> bool:
    """Whether the hub accepts ``body`` from the device over AMQPS (False: it rejected it)."""
    client = await amqp_client(port, data, cs)
    try:
        sender = await client.sender("/devices/dev1/messages/events")
        try:
            await client.send(sender, AmqpMessage(body=body))
        except (SendException, LinkDetached):  # rejected by the store, or over the link's bound at the head
            return False
        return True
    finally:
        await client.close()


async def config_show(data: Path, manifest: Path) -> dict[str, str]:
    """``edgehub config show``'s rows, name -> the rest of the line."""
    proc = await asyncio.create_subprocess_exec(
        EDGEHUB, "config", "show", "--manifest", str(manifest), "--data-dir", str(data), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    return dict(line.split(maxsplit=1) for line in out.decode().splitlines())


def lines_say(lines: list[str], text: str) -> bool:
    return any(text in line for line in lines)


async def test_admin_raises_the_message_size_live_cloud_changes_partitions_for_the_restart_and_an_edited_file_wins(
    tmp_path: Path,
) -> None:
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    desired = {"schemaVersion": "1.1", "$version": 1, "routes": ROUTES}
    write_manifest(manifest, desired)
    cs = await identity_add(data, "dev1")
    ca = data / "certs" / "ca.pem"
    async with (
        MosquittoPeer(tmp_path) as broker,
        CloudTwinService(host=broker.host, port=broker.port, desired=desired) as cloud,
    ):
        upstream = ("--upstream-mqtt", f"127.0.0.1:{broker.port}", "--upstream-client-id", "gw", "--admin-port", "0")
        proc, port, lines = await start(data, manifest, *upstream)
        try:
            assert lines_say(lines, "upstream: partitions=1")
            async with asyncio.timeout(60):
                await cloud.wait_for(lambda: cloud.reported.get("lastDesiredVersion") == 1)
            client = await admin(data)
            amqps = amqps_port(lines)

            # 1. maxMessageSizeBytes, live from the admin API: 300 KiB is refused (at the head: over the bound a
            # connection is told, 256 KiB and framing), then taken on both heads over new connections.
            assert await mqtt_publish(port, ca, cs, BIG) == ReasonCode.PACKET_TOO_LARGE
            assert not await amqp_accepted(amqps, data, cs, BIG)
            patch = {"delivery": {"queuePolicy": {"maxMessageSizeBytes": 512 * 1024}}}
            code, _ = await asyncio.to_thread(client.request, "PATCH", "/twin/desired", patch)
            assert code == 200
            assert await mqtt_publish(port, ca, cs, BIG) == 0
            assert await amqp_accepted(amqps, data, cs, BIG)
            # Above the hard cap the heads and the store share: refused, naming the key's path.
            over = {"delivery": {"queuePolicy": {"maxMessageSizeBytes": MAX_MESSAGE_SIZE_BYTES + 1}}}
            code, answer = await asyncio.to_thread(client.request, "PATCH", "/twin/desired", over, ok=(400,))
            assert isinstance(answer, dict)
            assert any(e.startswith("delivery.queuePolicy.maxMessageSizeBytes:") for e in answer["errors"])

            # 2. upstream.partitions from the cloud's twin: applied, reported as needing a restart.
            version = cloud.patch({"upstream": {"partitions": 2}})
            async with asyncio.timeout(30):
                await cloud.wait_for(lambda: cloud.reported.get("source") == "cloud")
            assert cloud.reported["runningDesiredVersion"] == version
            assert cloud.reported["restartRequired"] == ["upstream.partitions"], cloud.reported
        finally:
            assert (await stop(proc)).rstrip().endswith("stopped")

        # 3. The restart, the file unchanged: the deployment that last applied runs, partitions included.
        proc, port, lines = await start(data, manifest, *upstream)
        try:
            assert lines_say(lines, "upstream: partitions=2")
            client = await admin(data)
            now = await reported(client)
            assert (now["runningDesiredVersion"], now["source"], now["restartRequired"]) == (version, "cloud", [])
            assert await mqtt_publish(port, ca, cs, BIG) == 0  # the admin API's limit outlived the restart too
            # edgehub config show says what a start runs, reading the store while this hub holds it
            rows = await config_show(data, manifest)
            assert rows["deployment"].startswith("cloud (kept in the store")
            assert rows["upstream.partitions"].split() == ["2", "manifest"]
        finally:
            assert (await stop(proc)).rstrip().endswith("stopped")

    # 4. The file edited while the hub was stopped: the file wins at the next start.
    write_manifest(manifest, {**desired, "$version": 10, "upstream": {"partitions": 3}})
    proc, port, lines = await start(data, manifest, "--no-upstream", "--admin-port", "0")
    try:
        assert lines_say(lines, "upstream: partitions=3")
        now = await reported(await admin(data))
        assert (now["runningDesiredVersion"], now["source"], now["restartRequired"]) == (10, "file", [])
        assert await mqtt_publish(port, ca, cs, BIG) != 0  # the file sets no size: the default limit again
    finally:
        assert (await stop(proc)).rstrip().endswith("stopped")
