"""A paho client against the MQTT head over the real hub and a RocksDB store: a reported patch nested 100,000
deep, or 40 KB, gets IoT Hub's error status on ``$iothub/twin/res/{status}``, the twin is unchanged, and the
client's next telemetry is still acknowledged (the patch once raised RecursionError in the ingest task, and that
client never got another ack)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.hub.facade import EdgeHub
from edgehub.hub.twins import TwinLimits
from edgehub.routing import Router
from edgehub.store.rocks import open_rocks_store
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, Paho, sas_password, username

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

DEEP = b"[" * 100_000 + b"]" * 100_000  # 200 KB: under the head's packet limit
LARGE = json.dumps({"blob": "x" * 40_000}).encode()


async def served(tmp_path: Path, limits: TwinLimits) -> AsyncIterator[tuple[EdgeHub, MqttServer]]:
    store = open_rocks_store(tmp_path / "store")
    try:
        router = Router({"all": "FROM /* INTO $upstream"})
        async with EdgeHub(store=store, router=router, host_name=HOST, twin_limits=limits) as hub:
            await hub.identities.add_symmetric_key(DEV, DEVICE_KEY)
            async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
                yield hub, server
    finally:
        await store.close()


async def patch_then_telemetry(server: MqttServer, patches: list[bytes]) -> list[str]:
    """Send each patch (QoS 1) and a telemetry message after it; the twin response topics, in order. Every
    PUBLISH must be acknowledged."""
    dev = Paho.make("dev1")
    token = sas_password(DEV, DEVICE_KEY, expiry_s=int(time.time()) + 3600)  # within the hub's maximum lifetime
    assert await dev.connect(server.ports["tcp"], user=username(DEV), password=token) == 0
    dev.client.subscribe("$iothub/twin/res/#", qos=0)
    topics = []
    async with asyncio.timeout(20):
        await dev.subscribes.get()
        for rid, patch in enumerate(patches, start=1):
            sent = dev.publish(f"$iothub/twin/PATCH/properties/reported/?$rid={rid}", patch, qos=1)
            topics.append((await dev.messages.get()).topic)
            assert await dev.publishes.get() == (sent, 0)
            telemetry = dev.publish("devices/dev1/messages/events/", b"after", qos=1)
            assert await dev.publishes.get() == (telemetry, 0)
        dev.publish("$iothub/twin/GET/?$rid=99", b"", qos=0)
        twin = json.loads((await dev.messages.get()).payload)
    assert twin["reported"] == {"$version": 1}  # nothing refused was applied
    await dev.close()
    return topics


async def test_deep_and_large_patches_get_413_with_the_default_limits_and_telemetry_goes_on(tmp_path: Path) -> None:
    async for hub, server in served(tmp_path, TwinLimits()):
        topics = await patch_then_telemetry(server, [DEEP, LARGE])
        assert topics == ["$iothub/twin/res/413/?$rid=1", "$iothub/twin/res/413/?$rid=2"]
        assert hub.store.usage("$upstream")[0] == 2  # both telemetry messages stored
        assert hub.refusals.total == 2


async def test_a_deep_patch_within_the_size_limit_gets_400_and_a_large_document_413(tmp_path: Path) -> None:
    # A patch limit above the packet size: the 100,000-deep patch reaches the depth check, and the 40 KB one
    # passes as a patch but would make the reported document over 32 KB.
    async for _, server in served(tmp_path, TwinLimits(max_patch_bytes=1 << 20)):
        topics = await patch_then_telemetry(server, [DEEP, LARGE])
        assert topics == ["$iothub/twin/res/400/?$rid=1", "$iothub/twin/res/413/?$rid=2"]
