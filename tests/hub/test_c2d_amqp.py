"""Cloud-to-device messages to a device connected over AMQP, through the real hub (RocksDB store in tmp_path, the
AMQP head on 127.0.0.1 port 0, proton's own client): what ``EdgeHub.cloud_to_device`` stored (what the upstream's
cloud link calls for each device-bound message) reaches the device on its device-bound link, and the device's
settlement is the checkpoint: what it left unsettled comes again after it reconnects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from proton import Link

from edgehub.core import Message
from edgehub.core.endpoints import device_endpoint
from edgehub.hub.facade import EdgeHub
from edgehub.routing import Router
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from protocol_heads.amqp import AmqpServer, AmqpSettings
from tests.protocol_heads.amqp.conftest import DEV, DEVICE_KEY, HOST, ProtonClient, accept, receive, sas_token

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

DEVICEBOUND = device_endpoint("dev1")
ADDRESS = "/devices/dev1/messages/devicebound"


@asynccontextmanager
async def served(data: Path) -> AsyncIterator[tuple[EdgeHub, AmqpServer, Store]]:
    store = open_rocks_store(data / "store")
    try:
        router = Router({"up": "FROM /messages/* INTO $upstream"})
        async with EdgeHub(store=store, router=router, host_name=HOST) as hub:
            await hub.identities.add_symmetric_key(DEV, DEVICE_KEY)
            settings = AmqpSettings(tcp_port=0, tls_port=None, connect_timeout_s=5.0)
            async with AmqpServer(hub, settings=settings) as server:
                yield hub, server, store
    finally:
        await store.close()


async def device(server: AmqpServer, hub: EdgeHub) -> ProtonClient:
    token = sas_token(DEV, DEVICE_KEY, expiry_s=int(hub.clock.time()) + 3600)  # within the hub's token lifetime
    return await ProtonClient.connect(server.ports["amqp"], user=f"dev1@sas.{HOST}", password=token)


def c2d(body: bytes) -> Message:
    return Message(body, {"cmd": "on"}, {"messageId": body.decode()})


async def test_a_device_bound_message_reaches_an_amqp_device_and_its_settlement_checkpoints_it(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, store):
        await hub.cloud_to_device("dev1", c2d(b"m1"))  # returns once durable
        [queue] = store.queues(DEVICEBOUND)
        before = store.checkpoint(queue).committed
        client = await device(server, hub)
        try:
            receiver = await client.receiver(ADDRESS, credit=5)
            got = await receive(receiver)
            assert got.body == b"m1"
            assert got.id == "m1"
            assert got.properties == {"cmd": "on"}
            assert store.checkpoint(queue).committed == before  # not settled yet: not delivered
            await accept(receiver)
            await client.pump_until(lambda: store.checkpoint(queue).committed > before)
            assert store.checkpoint(queue).committed == before + 1
        finally:
            await client.close()


async def test_what_an_amqp_device_left_unsettled_comes_again_after_it_reconnects(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server, store):
        await hub.cloud_to_device("dev1", c2d(b"m1"))
        await hub.cloud_to_device("dev1", c2d(b"m2"))
        [queue] = store.queues(DEVICEBOUND)
        before = store.checkpoint(queue).committed
        client = await device(server, hub)
        receiver = await client.receiver(ADDRESS, credit=5)
        assert (await receive(receiver)).body == b"m1"
        await accept(receiver)
        assert (await receive(receiver)).body == b"m2"  # received, never settled
        await client.pump_until(lambda: store.checkpoint(queue).committed > before)
        await client.close()
        assert store.checkpoint(queue).committed == before + 1  # m1 only

        client = await device(server, hub)
        try:
            receiver = await client.receiver(ADDRESS, credit=5)
            again = await receive(receiver)
            assert again.body == b"m2"
            assert again.delivery_count == 1
            await accept(receiver)
            await client.pump_until(lambda: store.checkpoint(queue).committed >= before + 2)
        finally:
            await client.close()


class _MaxMessageSize:
    """A proton link option (the shape proton's ``LinkOption`` has; proton is untyped, so not its subclass): the
    receiver announces a max-message-size at attach, as a constrained device may."""

    def __init__(self, size: int) -> None:
        self.size = size

    def test(self, link: Link) -> bool:
        return True

    def apply(self, link: Link) -> None:
        link.max_message_size = self.size


async def test_a_message_over_the_devices_max_message_size_is_dead_lettered_and_the_next_arrives(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (hub, server, store):
        await hub.cloud_to_device("dev1", c2d(b"poison" + b"x" * 5_000))
        await hub.cloud_to_device("dev1", c2d(b"good"))
        client = await device(server, hub)
        try:
            receiver = await asyncio.to_thread(client.conn.create_receiver, ADDRESS, 5, options=_MaxMessageSize(1_000))
            got = await receive(receiver)
            assert got.body == b"good"
            await accept(receiver)
            await client.pump_until(lambda: len(store.dead_letters(DEVICEBOUND)) == 1)
            [dead] = store.dead_letters(DEVICEBOUND)
        finally:
            await client.close()
    assert dead.message.body.startswith(b"poison")
    assert dead.reason == "invalid"
    assert dead.error is not None
    assert "over the client's max-message-size of 1,000" in dead.error


async def test_a_message_an_amqp_device_releases_is_abandoned_and_delivered_again(tmp_path: Path) -> None:
    # IoT Hub's abandon: the Azure SDKs release the delivery; the message is delivered again, marked so.
    async with served(tmp_path) as (hub, server, store):
        await hub.cloud_to_device("dev1", c2d(b"m1"))
        [queue] = store.queues(DEVICEBOUND)
        before = store.checkpoint(queue).committed
        client = await device(server, hub)
        try:
            receiver = await client.receiver(ADDRESS, credit=5)
            first = await receive(receiver)
            assert first.body == b"m1"
            await asyncio.to_thread(receiver.release, False)  # released, not modified
            again = await receive(receiver)  # after the executor's retry wait
            assert again.body == b"m1"
            assert again.delivery_count == 1
            assert store.checkpoint(queue).committed == before  # not completed yet
            await accept(receiver)
            await client.pump_until(lambda: store.checkpoint(queue).committed == before + 1)
        finally:
            await client.close()
        assert store.dead_letters(DEVICEBOUND) == []


async def test_a_message_an_amqp_device_rejects_is_dead_lettered_and_the_next_arrives(tmp_path: Path) -> None:
    # IoT Hub's reject: the message is dead-lettered at once, never delivered again.
    async with served(tmp_path) as (hub, server, store):
        await hub.cloud_to_device("dev1", c2d(b"bad"))
        await hub.cloud_to_device("dev1", c2d(b"good"))
        client = await device(server, hub)
        try:
            receiver = await client.receiver(ADDRESS, credit=1)
            assert (await receive(receiver)).body == b"bad"
            await asyncio.to_thread(receiver.reject)
            assert (await receive(receiver)).body == b"good"
            await accept(receiver)
            await client.pump_until(lambda: len(store.dead_letters(DEVICEBOUND)) == 1)
            [dead] = store.dead_letters(DEVICEBOUND)
        finally:
            await client.close()
    assert dead.message.body == b"bad"
    assert dead.reason == "invalid"
    assert dead.error is not None
    assert "rejected by the client" in dead.error
