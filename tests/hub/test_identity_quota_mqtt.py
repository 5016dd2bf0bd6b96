"""Store quotas through the MQTT head, the real hub and RocksDB: an MQTT 5 device that publishes past its share of
the store gets PUBACK 0x97 (quota exceeded) while another device is still accepted, before and after a restart;
and ``edgehub run``'s default quota comes from the free space of the store's filesystem (a real 8 MB tmpfs)."""

from __future__ import annotations

import asyncio
import base64
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from edgehub.core import Identity, Message, RouteResult
from edgehub.hub.facade import EdgeHub
from edgehub.routing import Router
from edgehub.runtime.compose.config import HubLimits
from edgehub.runtime.compose.store import store_quota
from edgehub.store import QueuePolicy, StoreQuota
from edgehub.store.rocks import open_rocks_store
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.mqtt.conftest import HOST, Paho, sas_password, username
from tests.store.fulldisk import fill, small_disk

__all__ = ["small_disk"]  # the fixture, imported for use here

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

KEY = base64.b64encode(b"k" * 32).decode()
NOISY, QUIET = Identity.parse("noisy"), Identity.parse("quiet")
QUOTA = StoreQuota(max_bytes=40_000, identity_share=0.25)  # 10,000 bytes each
BODY = b"x" * 1000
QUOTA_EXCEEDED = 0x97


@asynccontextmanager
async def hub_at(path: Path) -> AsyncIterator[MqttServer]:
    store = open_rocks_store(path, store_quota=QUOTA, default_policy=QueuePolicy(enqueue_timeout_s=0))
    try:
        router = Router({"all": "FROM /* INTO $upstream"})  # no upstream transport: messages stay queued
        async with EdgeHub(store=store, router=router, host_name=HOST) as hub:
            for identity in (NOISY, QUIET):
                await hub.identities.add_symmetric_key(identity, KEY)
            async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
                yield server
    finally:
        await store.close()


async def publish(server: MqttServer, identity: Identity, count: int) -> list[int]:
    """Publish ``count`` QoS 1 messages of 1,000 bytes as an MQTT 5 client; the PUBACK reason codes, in order."""
    client = Paho.make(identity.id, protocol=mqtt.MQTTv5)
    token = sas_password(identity, KEY, expiry_s=int(time.time()) + 3600)
    assert await client.connect(server.ports["tcp"], user=username(identity), password=token) == 0
    codes: dict[int, int] = {}
    try:
        async with asyncio.timeout(20):
            mids = [client.publish(f"devices/{identity.id}/messages/events/", BODY) for _ in range(count)]
            while len(codes) < count:
                mid, rc = await client.publishes.get()
                codes[mid] = rc
    finally:
        await client.close()
    return [codes[mid] for mid in mids]


async def test_a_device_past_its_share_gets_0x97_while_another_is_accepted_across_a_restart(tmp_path: Path) -> None:
    async with hub_at(tmp_path / "store") as server:
        codes = await publish(server, NOISY, 12)
        # ~1,050 charged bytes a message (body and the hub's identity stamps): nine fit in 10,000 bytes.
        assert codes[:9] == [0] * 9
        assert codes[9:] == [QUOTA_EXCEEDED] * 3
        assert await publish(server, QUIET, 2) == [0, 0]
    async with hub_at(tmp_path / "store") as server:
        assert await publish(server, NOISY, 1) == [QUOTA_EXCEEDED]
        assert await publish(server, QUIET, 1) == [0]


async def test_the_default_store_quota_comes_from_the_free_disk(small_disk: Path) -> None:
    store = open_rocks_store(small_disk / "store")
    try:
        await store.enqueue(Message(b"x" * 10_000), [RouteResult("$upstream", 0)])
        held = store.usage(None)[1]
        before = shutil.disk_usage(small_disk).free
        quota = store_quota(store, small_disk / "store", HubLimits())
        after = shutil.disk_usage(small_disk).free
        assert quota.max_bytes is not None
        assert held + min(before, after) // 2 <= quota.max_bytes <= held + max(before, after) // 2
        assert quota.max_bytes < 8 << 20  # this filesystem's, not a fixed default
        assert quota.identity_max_bytes == quota.max_bytes // 4
        fill(small_disk / "filler")  # a full disk leaves what the store holds, and no more
        full = store_quota(store, small_disk / "store", HubLimits())
        assert full.max_bytes is not None
        assert held <= full.max_bytes < held + 64 * 1024
        assert store_quota(store, small_disk / "store", HubLimits(store_max_bytes=None)).max_bytes is None
        assert store_quota(store, small_disk / "store", HubLimits(store_max_bytes=5000)).max_bytes == 5000
    finally:
        await store.close()
