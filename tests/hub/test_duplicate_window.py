"""The hub's duplicate window over a real store (in memory, reopened as a restart would) with a manual clock:
records written with the message, copies in flight at once, expiry on disk, odd message ids."""

from __future__ import annotations

import asyncio

import pytest

from edgehub.core import Identity, Message
from edgehub.core.refusals import RefusalReason
from edgehub.hub import Rejected, Stored
from edgehub.hub.dedup import DEDUP_PREFIX
from edgehub.hub.facade import EdgeHub
from edgehub.hub.lanes import UpstreamOptions
from edgehub.routing import Router
from edgehub.store import MemoryBackend, QueueId, QueuePolicy, RemovalReason, Store
from edgehub.testing import ManualClock

pytestmark = pytest.mark.timeout(30)

DEV = Identity.parse("dev1")
MOD = Identity.parse("dev1/m")
DETECT = UpstreamOptions(duplicate_detection=True, duplicate_window_s=600)


def hub_over(store: Store, clock: ManualClock, options: UpstreamOptions = DETECT) -> EdgeHub:
    router = Router({"all": "FROM /* INTO $upstream"})
    return EdgeHub(store=store, router=router, host_name="hub.test", clock=clock, upstream=options)


def msg(mid: str, body: bytes = b"x") -> Message:
    return Message(body, {}, {"messageId": mid})


def queued(store: Store) -> list[bytes]:
    return [it.message.body for q in store.queues("$upstream") for it in store.read(q, 0, 100)]


async def test_two_copies_in_one_group_store_the_first_and_drop_the_second() -> None:
    store = Store.in_memory()
    async with hub_over(store, ManualClock()) as hub:
        first, second = await hub.ingest(DEV, [msg("m-1", b"a"), msg("m-1", b"b")])
        assert isinstance(first, Stored)
        assert not first.duplicate
        assert second == Stored(None, duplicate=True)
        assert queued(store) == [b"a"]
        assert hub.duplicates_dropped == 1


async def test_a_copy_later_in_a_group_is_dropped_and_the_messages_around_it_are_stored_in_order() -> None:
    # The copy of m-1 waits for the first one to be settled, which needs the messages before it written first:
    # the group is stored in two writes, in order, and answered as one.
    store = Store.in_memory()
    async with hub_over(store, ManualClock()) as hub:
        group = [msg("m-1", b"a"), msg("m-2", b"b"), msg("m-1", b"c"), msg("m-3", b"d")]
        outcomes = await asyncio.wait_for(hub.ingest(DEV, group), 10)
        assert [o.duplicate for o in outcomes if isinstance(o, Stored)] == [False, False, True, False]
        assert queued(store) == [b"a", b"b", b"d"]
        assert [k for k, _ in store.metadata_items(DEDUP_PREFIX)] == [
            "dedup/dev1/m-1",
            "dedup/dev1/m-2",
            "dedup/dev1/m-3",
        ]
        assert store.groups_written == 2


async def test_a_refused_first_copy_lets_its_second_copy_in_the_same_group_through() -> None:
    store = Store.in_memory(default_policy=QueuePolicy(max_message_size_bytes=200))
    async with hub_over(store, ManualClock()) as hub:
        refused, taken = await asyncio.wait_for(hub.ingest(DEV, [msg("m-1", b"x" * 300), msg("m-1", b"small")]), 10)
        assert isinstance(refused, Rejected)
        assert refused.reason == RefusalReason.MESSAGE_TOO_LARGE
        assert isinstance(taken, Stored)
        assert not taken.duplicate
        assert queued(store) == [b"small"]
        assert hub.duplicates_dropped == 0


async def test_the_record_of_an_accepted_id_is_in_the_metadata_and_goes_once_its_window_has_passed() -> None:
    clock = ManualClock()
    store = Store.in_memory()
    async with hub_over(store, clock) as hub:
        await hub.ingest(DEV, [msg("m-1")])
        assert [k for k, _ in store.metadata_items(DEDUP_PREFIX)] == ["dedup/dev1/m-1"]
        clock.advance(600)
        await hub.ingest(DEV, [msg("m-2")])  # its group write also deletes the expired record
        assert [k for k, _ in store.metadata_items(DEDUP_PREFIX)] == ["dedup/dev1/m-2"]
        assert hub.upstream_status().duplicate_ids_held == 1


async def test_expired_records_left_on_disk_are_not_loaded_and_are_deleted_later() -> None:
    clock = ManualClock()
    backend = MemoryBackend()
    store = Store(backend, clock=clock)
    async with hub_over(store, clock) as hub:
        await hub.ingest(DEV, [msg("old")])
    await store.close()
    clock.advance(900)
    store = Store(backend.reopened(), clock=clock)
    async with hub_over(store, clock) as hub:
        assert hub.upstream_status().duplicate_ids_held == 0
        assert [o.duplicate for o in await hub.ingest(DEV, [msg("old")]) if isinstance(o, Stored)] == [False]
        assert [k for k, _ in store.metadata_items(DEDUP_PREFIX)] == ["dedup/dev1/old"]  # the new record only


async def test_a_module_and_a_device_whose_ids_could_run_together_are_kept_apart() -> None:
    store = Store.in_memory()
    async with hub_over(store, ManualClock()) as hub:
        await hub.ingest(MOD, [msg("x", b"module's x")])
        await hub.ingest(DEV, [msg("m/x", b"device's m/x")])  # "dev1" + "m/x" must not read as "dev1/m" + "x"
        assert hub.duplicates_dropped == 0
        assert sorted(queued(store)) == [b"device's m/x", b"module's x"]
    backend_keys = [k for k, _ in store.metadata_items(DEDUP_PREFIX)]
    assert backend_keys == ["dedup/dev1%2Fm/x", "dedup/dev1/m/x"]


async def test_with_detection_off_nothing_is_recorded_and_copies_are_stored() -> None:
    store = Store.in_memory()
    async with hub_over(store, ManualClock(), UpstreamOptions()) as hub:
        await hub.ingest(DEV, [msg("m-1", b"a"), msg("m-1", b"b")])
        assert queued(store) == [b"a", b"b"]
        assert store.metadata_items(DEDUP_PREFIX) == []
        assert hub.duplicates_dropped == 0


async def test_a_refused_message_is_not_recorded_so_its_retry_is_taken() -> None:
    store = Store.in_memory()
    conflicting = Message(b"a", {}, {"messageId": "m-1", "sessionId": "s", "partitionKey": "p"})
    async with hub_over(store, ManualClock()) as hub:
        [refused] = await hub.ingest(DEV, [conflicting])
        assert isinstance(refused, Rejected)
        assert refused.reason == "partition_key_mismatch"
        assert "sessionId 's' and partitionKey 'p' differ" in refused.detail
        [taken] = await hub.ingest(DEV, [msg("m-1", b"b")])
        assert isinstance(taken, Stored)
        assert not taken.duplicate
        assert queued(store) == [b"b"]
        assert store.queues("$upstream") == [QueueId("$upstream", 10)]


async def test_a_message_waiting_for_room_keeps_its_place_in_its_group() -> None:
    # Each message of a group claims its id and gets its offsets in turn: the second (small enough to fit at
    # once) must not overtake the first while that one waits for room, and both are acknowledged once stored.
    clock = ManualClock()
    store = Store(MemoryBackend(), clock=clock)
    async with hub_over(store, clock) as hub:
        await hub.ingest(DEV, [msg("m-0", b"o" * 60)])
        q = store.queues("$upstream")[0]
        _, first_size = store.usage("$upstream")
        stamps = first_size - 60  # what the hub adds to each (same-length ids and times here)
        # Room for the first and a 1-byte message, not for a second 60-byte one.
        store.endpoint_policies["$upstream"] = QueuePolicy(max_bytes=first_size + 1 + stamps, enqueue_timeout_s=10)
        sleeping = clock.sleepers
        group = asyncio.create_task(hub.ingest(DEV, [msg("m-1", b"b" * 60), msg("m-2", b"s")]))
        async with asyncio.timeout(10):
            await clock.wait_for_sleepers(sleeping + 1)
        assert store.next_offset(q) == 1  # neither has its offset while the first waits
        await store.remove(q, [0], RemovalReason.DELIVERED)
        first, second = await asyncio.wait_for(group, 10)
        assert isinstance(first, Stored)
        assert isinstance(second, Stored)
        assert queued(store) == [b"b" * 60, b"s"]
        ids = [k for k, _ in store.metadata_items(DEDUP_PREFIX)]
        assert ids == ["dedup/dev1/m-0", "dedup/dev1/m-1", "dedup/dev1/m-2"]
