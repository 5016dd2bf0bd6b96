"""The store contract, run over the in-memory and the RocksDB store alike."""

from __future__ import annotations

import asyncio

import pytest

from edgehub.core import DEFAULT_PRIORITY, Message, RouteResult, StoreClosedError, SystemProperty
from edgehub.store import FsyncPolicy, Overflow, QueueId, QueuePolicy, RemovalReason, Store
from edgehub.testing import ManualClock
from tests.store.conftest import StoreFactory, keep_time


def msg(i: int) -> Message:
    return Message(body=f"m{i}".encode(), properties={"i": str(i)})


async def test_enqueue_writes_one_reference_per_routed_queue(store: Store) -> None:
    receipt = await store.enqueue(msg(1), [RouteResult("up", 0), RouteResult("mod", 3, ttl_s=5)])
    assert [q for q, _ in receipt.refs] == [QueueId("up", 0), QueueId("mod", 3)]
    (up,) = store.read(QueueId("up", 0), 0, 10)
    (mod,) = store.read(QueueId("mod", 3), 0, 10)
    assert up.message == mod.message == receipt.message
    assert up.message_key == mod.message_key  # one body, two references
    assert mod.ttl_s == 5.0
    assert up.ttl_s == store.default_ttl_s


async def test_enqueue_stores_the_message_as_given_the_hub_stamps_it(store: Store, clock: ManualClock) -> None:
    receipt = await store.enqueue(msg(1), [RouteResult("up")])
    assert receipt.message == msg(1)
    assert SystemProperty.EDGE_MESSAGE_ID not in receipt.message.system_properties
    assert receipt.refs == ((QueueId("up", DEFAULT_PRIORITY), 0),)
    (item,) = store.read(QueueId("up", DEFAULT_PRIORITY), 0, 10)
    assert item.message == msg(1)
    assert item.enqueued_at_s == clock.time()  # the reference's time, from the store's clock


async def test_message_routed_nowhere_is_not_stored(store: Store) -> None:
    receipt = await store.enqueue(msg(1), [])
    assert receipt.refs == ()
    assert store.queues() == []


async def test_offsets_grow_and_read_returns_queue_order(store: Store) -> None:
    q = QueueId("up", 1)
    for i in range(5):
        await store.enqueue(msg(i), [RouteResult("up", 1)])
    items = store.read(q, 0, 10)
    assert [it.offset for it in items] == [0, 1, 2, 3, 4]
    assert [it.message.body for it in items] == [f"m{i}".encode() for i in range(5)]
    assert [it.offset for it in store.read(q, 3, 10)] == [3, 4]
    assert [it.offset for it in store.read(q, 0, 2)] == [0, 1]


async def test_messages_kept_in_memory_for_readers_are_bounded_by_bytes(store: Store) -> None:
    q = QueueId("up", 0)
    big = 250_000
    for i in range(80):  # 20 MB of bodies: more than the 16 MiB kept in memory
        await store.enqueue(Message(body=bytes([i]) * big), [RouteResult("up", 0)])
    held, held_bytes = store.held_in_memory
    assert 60 <= held < 80
    assert held_bytes <= 16 << 20
    items = store.read(q, 0, 100)  # the ones past the bound come from the database, the same
    assert [it.offset for it in items] == list(range(80))
    assert all(it.message.body == bytes([it.offset]) * big for it in items)
    assert store.read_start(q, 0, held) == (items[:held], held, 0)  # memory answers as far as it holds them
    assert store.read_start(q, 0, 100) == (items[:held], held, 100 - held)  # past that, only the database can
    assert store.read_start(q, held, 5) == ([], held, 5)
    assert store.read_start(q, 80, 5) == ([], 80, 0)  # nothing durable there
    assert store.read_durable(q, held, 100 - held) == items[held:]
    await store.commit(q, 79)
    assert store.held_in_memory == (0, 0)
    await store.enqueue(msg(1), [RouteResult("up", 0)])  # room again
    assert store.held_in_memory[0] == 1


async def test_concurrent_producers_are_grouped_and_acknowledged_in_arrival_order(store: Store) -> None:
    acks: list[int] = []

    async def produce(i: int) -> None:
        receipt = await store.enqueue(msg(i), [RouteResult("up", 0)])
        acks.append(receipt.refs[0][1])

    async with asyncio.timeout(10):
        await asyncio.gather(*(produce(i) for i in range(200)))
    items = store.read(QueueId("up", 0), 0, 1000)
    # offsets are handed out in arrival order, and the acks come back in that same order, group after group
    assert [it.message.body for it in items] == [f"m{i}".encode() for i in range(200)]
    assert acks == list(range(200))
    assert store.groups_written < 200


async def test_commit_hides_delivered_and_survives_reopen(store_factory: StoreFactory) -> None:
    s = store_factory()
    q = QueueId("up", 0)
    for i in range(4):
        await s.enqueue(msg(i), [RouteResult("up", 0)])
    await s.commit(q, 1, unhealthy_since_s=12.0)
    assert [it.offset for it in s.read(q, 0, 10)] == [2, 3]
    await s.close()
    s = store_factory()
    try:
        assert s.checkpoint(q).committed == 1
        assert s.checkpoint(q).unhealthy_since_s == 12.0
        assert [it.offset for it in s.read(q, 0, 10)] == [2, 3]
    finally:
        await s.close()


async def test_offsets_keep_growing_after_queue_emptied_and_reopened(store_factory: StoreFactory) -> None:
    s = store_factory()
    q = QueueId("up", 0)
    for i in range(3):
        await s.enqueue(msg(i), [RouteResult("up", 0)])
    await s.remove(q, [0, 1, 2], RemovalReason.TTL)
    await s.close()
    s = store_factory()
    try:
        receipt = await s.enqueue(msg(9), [RouteResult("up", 0)])
        assert receipt.refs == ((q, 3),)
    finally:
        await s.close()


async def test_body_is_deleted_with_its_last_reference(store: Store) -> None:
    r = await store.enqueue(msg(1), [RouteResult("a", 0), RouteResult("b", 0)])
    key = store.read(QueueId("a", 0), 0, 1)[0].message_key
    await store.remove(QueueId("a", 0), [0], RemovalReason.DELIVERED)
    assert store.read(QueueId("b", 0), 0, 1)[0].message == r.message  # b still has it
    await store.remove(QueueId("b", 0), [0], RemovalReason.TTL)
    assert not store.has_message(key)
    assert store.removed[RemovalReason.DELIVERED] == 1
    assert store.removed[RemovalReason.TTL] == 1


async def test_remove_delivered_takes_everything_up_to_the_checkpoint_in_chunks(
    store_factory: StoreFactory,
) -> None:
    s = store_factory()
    a, b = QueueId("a", 0), QueueId("b", 0)
    for i in range(7):  # 0, 2, 4, 6 also go to b: their bodies must stay while b holds them
        await s.enqueue(msg(i), [RouteResult("a", 0)] + ([RouteResult("b", 0)] if i % 2 == 0 else []))
    keys = [it.message_key for it in s.read(a, 0, 10)]
    await s.remove(a, [1], RemovalReason.TTL)  # a hole below the checkpoint
    await s.close()
    s = store_factory()  # reopened: nothing is held in memory, so the commits below remove nothing themselves
    await s.commit(a, 4)
    assert await s.remove_delivered(a, chunk=2) == 4  # 0, 2, 3, 4: two full chunks
    assert [r.offset for r in s.references(a, 0, 10)] == [5, 6]
    assert [s.has_message(k) for k in keys] == [True, False, True, False, True, True, True]
    assert s.usage("a") == (2, len(b"m5") + len(b"m6") + 2 * len("i1"))
    assert await s.remove_delivered(a) == 0  # nothing new below the checkpoint
    await s.commit(b, 3)
    assert await s.remove_delivered(b) == 4
    assert [s.has_message(k) for k in keys] == [False, False, False, False, False, True, True]
    assert s.removed[RemovalReason.DELIVERED] == 8
    await s.commit(a, 6)
    await s.close()
    s = store_factory()  # a fresh store knows no head: it scans from the start
    try:
        assert await s.remove_delivered(a) == 2
        assert s.usage() == (0, 0)
        assert s.removed[RemovalReason.DELIVERED] == 10
        with pytest.raises(ValueError):
            await s.remove_delivered(a, chunk=0)
    finally:
        await s.close()


async def test_commit_removes_the_held_deliveries_that_are_their_messages_only_reference(
    store_factory: StoreFactory,
) -> None:
    s = store_factory()
    a, b = QueueId("a", 0), QueueId("b", 0)
    for i in range(6):  # 1 and 4 also go to b: their references in a stay for remove_delivered
        await s.enqueue(msg(i), [RouteResult("a", 0)] + ([RouteResult("b", 0)] if i in (1, 4) else []))
    keys = [it.message_key for it in s.read(a, 0, 10)]
    assert s.held_in_memory[0] == 8
    await s.commit(a, 3)
    assert [r.offset for r in s.references(a, 0, 10)] == [1, 4, 5]  # 0, 2, 3 gone with the commit
    assert [s.has_message(k) for k in keys] == [False, True, False, False, True, True]
    assert s.removed[RemovalReason.DELIVERED] == 3
    assert s.usage("a") == (3, 3 * (len(b"m0") + len("i0")))
    assert s.usage() == (3, 3 * (len(b"m0") + len("i0")))  # bodies: 1, 4 and 5
    assert s.held_in_memory[0] == 4  # a's 4 and 5, b's two
    assert [it.offset for it in s.read(a, 0, 10)] == [4, 5]
    assert await s.remove_delivered(a) == 1  # the shared one, 1; its body stays for b
    assert s.has_message(keys[1])
    await s.commit(b, 0)  # b's 0 is message 1: its last reference, but not the only one it had
    assert await s.remove_delivered(b) == 1
    assert not s.has_message(keys[1])
    await s.commit(a, 5)
    assert [r.offset for r in s.references(a, 0, 10)] == [4]
    assert s.removed[RemovalReason.DELIVERED] == 6
    await s.close()
    s = store_factory()  # the counts, usage and checkpoint survive a restart; the next offset does not go back
    try:
        assert s.removed[RemovalReason.DELIVERED] == 6
        assert s.usage() == (1, len(b"m4") + len("i4"))  # message 4: b still holds it
        assert s.checkpoint(a).committed == 5
        assert (await s.enqueue(msg(6), [RouteResult("a", 0)])).refs == ((a, 6),)
    finally:
        await s.close()


async def test_commit_removes_a_run_of_consecutive_deliveries_and_nothing_around_it(store: Store) -> None:
    a, b = QueueId("a", 0), QueueId("b", 0)
    for i in range(4):  # bodies 0-3 for a, then 4 for b, then 5-8 for a: a's offsets 0-7 are consecutive
        await store.enqueue(msg(i), [RouteResult("a", 0)])
    await store.enqueue(msg(9), [RouteResult("b", 0)])
    for i in range(4, 8):
        await store.enqueue(msg(i), [RouteResult("a", 0)])
    a_keys = [it.message_key for it in store.read(a, 0, 10)]
    (b_item,) = store.read(b, 0, 10)
    await store.commit(a, 2)  # offsets 0-2, bodies 0-2: both consecutive
    assert [r.offset for r in store.references(a, 0, 10)] == [3, 4, 5, 6, 7]
    assert [store.has_message(k) for k in a_keys] == [False] * 3 + [True] * 5
    await store.commit(a, 6)  # offsets 3-6 are consecutive, their bodies (3, 5, 6, 7) are not: b's 4 is between
    assert [r.offset for r in store.references(a, 0, 10)] == [7]
    assert [store.has_message(k) for k in a_keys] == [False] * 7 + [True]
    assert store.has_message(b_item.message_key)
    assert [it.message.body for it in store.read(b, 0, 10)] == [b"m9"]
    assert store.usage("a") == (1, len(b"m7") + len("i7"))
    assert store.usage() == (2, 2 * (len(b"m7") + len("i7")))
    assert store.removed[RemovalReason.DELIVERED] == 7


async def test_dead_letters_are_listed_requeued_and_purged(store: Store) -> None:
    q = QueueId("up", 2)
    await store.enqueue(msg(1), [RouteResult("up", 2)])
    await store.enqueue(msg(2), [RouteResult("up", 2)])
    first = store.read(q, 0, 1)[0]
    await store.dead_letter(first, reason="invalid", attempts=3, error="bad json")
    assert [it.offset for it in store.read(q, 0, 10)] == [1]
    (dl,) = store.dead_letters("up")
    assert (dl.reason, dl.attempts, dl.error, dl.message.body) == ("invalid", 3, "bad json", b"m1")
    assert await store.requeue_dead_letters("up") == 1
    assert store.dead_letters("up") == []
    items = store.read(q, 0, 10)
    assert [(it.offset, it.message.body) for it in items] == [(1, b"m2"), (2, b"m1")]
    await store.dead_letter(items[1], reason="maxDeliveryAttempts", attempts=5)
    assert await store.purge_dead_letters("up") == 1
    assert store.dead_letters("up") == []
    assert not store.has_message(items[1].message_key)


async def test_removal_counts_by_reason_survive_reopen(store_factory: StoreFactory) -> None:
    full = QueuePolicy(max_messages=0, overflow=Overflow.DISCARD_INCOMING, enqueue_timeout_s=0)
    s = store_factory(endpoint_policies={"full": full})
    q = QueueId("up", 0)
    for i in range(3):
        await s.enqueue(msg(i), [RouteResult("up", 0)])
    await s.enqueue(msg(3), [RouteResult("up", 0), RouteResult("full", 0)])  # dropped for "full" only
    await s.enqueue(msg(4), [RouteResult("full", 0)])  # dropped everywhere
    await s.remove(q, [0], RemovalReason.DELIVERED)
    await s.remove(q, [1], RemovalReason.TTL)
    await s.dead_letter(s.read(q, 2, 1)[0], reason="invalid", attempts=1)
    assert await s.purge_dead_letters("up") == 1
    expected = {
        RemovalReason.DELIVERED: 1,
        RemovalReason.TTL: 1,
        RemovalReason.OVERFLOW: 2,
        RemovalReason.DEADLETTER: 1,
        RemovalReason.PURGED: 1,
        RemovalReason.DROPPED: 0,  # an endpoint a deployment dropped (edgehub.runtime.deployment.controller)
    }
    assert s.removed == expected
    await s.close()
    s = store_factory()
    try:
        assert s.removed == expected
        await s.remove(q, [3], RemovalReason.DELIVERED)
        assert s.removed[RemovalReason.DELIVERED] == 2
    finally:
        await s.close()


async def test_metadata_round_trips(store_factory: StoreFactory) -> None:
    s = store_factory()
    await s.put_metadata("identity/dev1", b"x")
    await s.close()
    s = store_factory()
    try:
        assert s.get_metadata("identity/dev1") == b"x"
        await s.put_metadata("identity/dev2", b"y")
        await s.put_metadata("other", b"z")
        assert s.metadata_items("identity/") == [("identity/dev1", b"x"), ("identity/dev2", b"y")]
        with pytest.raises(ValueError):
            await s.put_metadata("stats/i/up", b"")
        await s.put_metadata("identity/dev1", None)
        assert s.get_metadata("identity/dev1") is None
    finally:
        await s.close()


async def test_closed_store_refuses_use(store_factory: StoreFactory) -> None:
    s = store_factory()
    await s.close()
    with pytest.raises(StoreClosedError):
        await s.enqueue(msg(1), [RouteResult("up")])
    with pytest.raises(StoreClosedError):
        s.read(QueueId("up", 0), 0, 1)


@pytest.mark.parametrize("fsync", [FsyncPolicy.INTERVAL, FsyncPolicy.NONE])
async def test_every_fsync_policy_acknowledges_and_keeps_writes(
    store_factory: StoreFactory, clock: ManualClock, fsync: FsyncPolicy
) -> None:
    s = store_factory(fsync=fsync, fsync_interval_ms=5)
    ticker = asyncio.create_task(keep_time(clock, 0.005))
    try:
        async with asyncio.timeout(10):
            await asyncio.gather(*(s.enqueue(msg(i), [RouteResult("up", 0)]) for i in range(50)))
    finally:
        ticker.cancel()
    await s.close()
    s = store_factory()
    try:
        assert len(s.read(QueueId("up", 0), 0, 100)) == 50
    finally:
        await s.close()


async def test_commit_and_removal_racing_never_undo_the_commit(store: Store) -> None:
    q = QueueId("up", 0)
    for i in range(20):
        await store.enqueue(msg(i), [RouteResult("up", 0)])
    async with asyncio.timeout(10):
        await asyncio.gather(
            *(store.commit(q, i) for i in range(10)),
            *(store.remove(q, [i], RemovalReason.DELIVERED) for i in range(10)),
            *(store.remove(q, [i], RemovalReason.TTL) for i in range(15, 20)),
        )
    assert store.checkpoint(q).committed == 9
    assert [it.offset for it in store.read(q, 0, 100)] == [10, 11, 12, 13, 14]
