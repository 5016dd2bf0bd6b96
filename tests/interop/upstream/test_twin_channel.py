"""The twin channel over a real MQTT upstream connection to Mosquitto (standing in for IoT Hub): desired patches
in, in order, with the topic's version; reported properties out on every connection; bad payloads refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from edgehub.testing.cloud_twin import CloudTwinService
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.twin_channel import TwinChannel
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

REPORTED = "$iothub/twin/PATCH/properties/reported/#"


async def test_patches_reach_the_hub_in_order_and_reported_properties_are_sent_on_every_connection(
    tmp_path: Path,
) -> None:
    async with (
        MosquittoPeer(tmp_path) as broker,
        LinkSim(target_host=broker.host, target_port=broker.port) as link,
        MqttCollector(host=broker.host, port=broker.port, topic=REPORTED, client_id="cloud-twin") as reported,
    ):
        channel = TwinChannel(max_patch_bytes=1024)
        channel.report({"lastDesiredVersion": 1})
        up = MqttUpstream(
            MqttUpstreamSettings(host="127.0.0.1", port=link.port, client_id="gw", hub_id="gw", reconnect_min_s=0.05)
        )
        up.attach_twin(channel)
        cloud = Paho.make("cloud")
        applied: asyncio.Queue[dict[str, object]] = asyncio.Queue()

        async def apply(patch: dict[str, object]) -> None:
            await applied.put(patch)

        async with asyncio.timeout(30), up:
            await up.wait_connected()
            await reported.wait_for(1)
            assert json.loads(reported.messages[0].payload) == {"lastDesiredVersion": 1}
            assert reported.messages[0].topic.startswith("$iothub/twin/PATCH/properties/reported/?$rid=")
            assert await cloud.connect(broker.port) == 0
            # Before bind: kept, then applied in order.
            cloud.publish("$iothub/twin/PATCH/properties/desired/?$version=2", b'{"routes": {"a": "x"}}')
            cloud.publish("$iothub/twin/PATCH/properties/desired/?$version=3", b"[1, 2]")  # not an object
            cloud.publish("$iothub/twin/PATCH/properties/desired/?$version=4", b"{" * 2000)  # over the bound
            cloud.publish("$iothub/twin/PATCH/properties/desired/?$version=5", b'{"$version": 9, "b": null}')
            for _ in range(4):
                await cloud.publishes.get()
            channel.bind(apply)
            assert await applied.get() == {"routes": {"a": "x"}, "$version": 2}
            assert await applied.get() == {"$version": 9, "b": None}  # the body's version wins
            channel.report({"lastDesiredVersion": 9})
            await reported.wait_for(2)
            assert json.loads(reported.messages[1].payload) == {"lastDesiredVersion": 9}
            link.cut()  # the connection drops; the next one reports again
            link.restore()
            await reported.wait_for(3)
            assert json.loads(reported.messages[2].payload) == {"lastDesiredVersion": 9}
            assert channel.patches_applied == 2
            assert applied.empty()
        await channel.close()
        await cloud.close()


async def test_every_connection_fetches_the_twin_and_a_patch_missed_while_away_is_applied(tmp_path: Path) -> None:
    async with (
        MosquittoPeer(tmp_path) as broker,
        LinkSim(target_host=broker.host, target_port=broker.port) as link,
        CloudTwinService(host=broker.host, port=broker.port, desired={"routes": {"a": "x"}}) as cloud,
    ):
        channel = TwinChannel(max_patch_bytes=4096)
        up = MqttUpstream(
            MqttUpstreamSettings(host="127.0.0.1", port=link.port, client_id="gw", hub_id="gw", reconnect_min_s=0.05)
        )
        up.attach_twin(channel)
        running: list[int | None] = [1]  # the hub runs version 1: the twin's own
        puts: asyncio.Queue[dict[str, object]] = asyncio.Queue()

        async def apply(patch: dict[str, object]) -> None:
            raise AssertionError(f"no patch reaches a hub that was away: {patch}")

        async def put(desired: dict[str, object]) -> None:
            version = desired["$version"]
            assert isinstance(version, int)
            running[0] = version
            await puts.put(desired)

        channel.bind(apply, put=put, running_version=lambda: running[0])
        async with asyncio.timeout(30), up:
            await up.wait_connected()
            await cloud.wait_for(lambda: cloud.gets == 1)  # the version that runs: nothing put
            link.cut()
            await up.wait_for(lambda: not up.connected)
            version = cloud.patch({"routes": {"b": "y"}})  # QoS 0 to a hub that is away: lost, as with IoT Hub
            link.restore()
            assert await puts.get() == {"routes": {"a": "x", "b": "y"}, "$version": version}
            # Fetched again on the next connection, at the version that now runs: not put again.
            link.cut()
            await up.wait_for(lambda: not up.connected)
            link.restore()
            await cloud.wait_for(lambda: cloud.gets == 3)
            await up.wait_for(lambda: up.connected)
            # A cloud that fails a GET changes nothing; the next good answer is applied.
            cloud.answer_status = 429
            link.cut()
            await up.wait_for(lambda: not up.connected)
            version = cloud.patch({"routes": {"c": "z"}})
            link.restore()
            await cloud.wait_for(lambda: cloud.gets == 4)
            cloud.answer_status = 200
            link.cut()
            await up.wait_for(lambda: not up.connected)
            link.restore()
            got = await puts.get()
            assert got["$version"] == version
            assert channel.documents_applied == 2
            assert puts.empty()
        await channel.close()
