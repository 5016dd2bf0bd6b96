"""``Store.enqueue_many``, over both stores: a producer's group in one durable write, with a receipt or a refusal
per message in order, and the same answers ``enqueue`` gives, also when policies apply."""

from __future__ import annotations

import asyncio

from edgehub.core import Message, MessageTooLargeError, QuotaExceededError, RouteResult
from edgehub.store import EnqueueReceipt, QueueId, QueuePolicy, RemovalReason, Store
from edgehub.testing import ManualClock
from tests.store.conftest import StoreFactory

UP0, M1 = QueueId("up", 0), QueueId("/modules/m/inputs/i", 3)


def m(i: int, size: int = 10) -> Message:
    return Message(body=str(i).encode().ljust(size, b"."), system_properties={"messageId": f"id{i}"})


def bodies(store: Store, q: QueueId) -> list[bytes]:
    return [it.message.body for it in store.read(q, 0, 100)]


async def test_a_group_is_one_write_with_a_receipt_per_message_in_order(store: Store) -> None:
    before = store.groups_written
    out = await store.enqueue_many(
        [
            (m(0), [RouteResult("up", 0)]),
            (m(1), []),  # routed nowhere: accepted, stored nowhere
            (m(2), [RouteResult("up", 0), RouteResult(M1.endpoint, 3)]),
            (m(3), [RouteResult("up", 0)]),
        ]
    )
    assert store.groups_written == before + 1
    assert all(isinstance(r, EnqueueReceipt) for r in out)
    receipts = [r for r in out if isinstance(r, EnqueueReceipt)]
    assert [r.message.body[:1] for r in receipts] == [b"0", b"1", b"2", b"3"]
    assert [r.refs for r in receipts] == [((UP0, 0),), (), ((UP0, 1), (M1, 0)), ((UP0, 2),)]
    assert [r.message for r in receipts] == [m(i) for i in range(4)]  # stored as given: the hub stamps
    assert bodies(store, UP0) == [m(0).body, m(2).body, m(3).body]
    assert bodies(store, M1) == [m(2).body]
    assert store.end_offset(UP0) == 3  # every reference of the group is visible to the executor
    assert store.usage(None) == (3, 3 * m(0).size_bytes())  # three bodies, each stored once


async def test_a_message_too_large_is_refused_in_its_place_and_the_others_are_stored(
    store_factory: StoreFactory,
) -> None:
    s = store_factory(default_policy=QueuePolicy(max_message_size_bytes=50, enqueue_timeout_s=0))
    try:
        out = await s.enqueue_many([(m(0), [RouteResult("up", 0)]), (m(1, 60), [RouteResult("up", 0)])])
        assert isinstance(out[0], EnqueueReceipt)
        assert isinstance(out[1], MessageTooLargeError)
        out2 = await s.enqueue_many([(m(2), [RouteResult("up", 0)])])
        assert isinstance(out2[0], EnqueueReceipt)
        assert bodies(s, UP0) == [m(0).body, m(2).body]
    finally:
        await s.close()


async def test_with_a_quota_each_message_gets_what_enqueue_would_give(store_factory: StoreFactory) -> None:
    s = store_factory(endpoint_policies={"up": QueuePolicy(max_messages=2, enqueue_timeout_s=0)})
    try:
        out = await s.enqueue_many([(m(i), [RouteResult("up", 0)]) for i in range(3)])
        assert [type(r) for r in out] == [EnqueueReceipt, EnqueueReceipt, QuotaExceededError]
        assert s.usage("up") == (2, 2 * m(0).size_bytes())
        assert bodies(s, UP0) == [m(0).body, m(1).body]
    finally:
        await s.close()


async def test_a_route_result_used_again_follows_a_changed_default_ttl(store: Store) -> None:
    route = [RouteResult("up", 0)]  # no TTL of its own: the store's default applies, as it is at enqueue
    await store.enqueue_many([(m(0), route)])
    store.default_ttl_s = 5.0
    await store.enqueue_many([(m(1), route)])
    assert [it.ttl_s for it in store.read(UP0, 0, 10)] == [7200.0, 5.0]


async def test_with_a_quota_a_message_waiting_for_room_keeps_its_place(
    store_factory: StoreFactory, clock: ManualClock
) -> None:
    # Room for 30 bytes: 20 are taken, so the 20-byte message waits and the 5-byte one behind it would fit at
    # once. It must not overtake: the group keeps its order in the queue.
    s = store_factory(endpoint_policies={"up": QueuePolicy(max_bytes=30, enqueue_timeout_s=10)})
    try:
        await s.enqueue(Message(b"o" * 20), [RouteResult("up", 0)])
        big, small = Message(b"b" * 20), Message(b"s" * 5)
        async with asyncio.timeout(10):
            group = asyncio.create_task(
                s.enqueue_many([(big, [RouteResult("up", 0)]), (small, [RouteResult("up", 0)])])
            )
            await clock.wait_for_sleepers(1)
            assert s.next_offset(UP0) == 1  # neither has an offset while the first waits for room
            await s.remove(UP0, [0], RemovalReason.DELIVERED)
            out = await group
        assert [r.refs for r in out if isinstance(r, EnqueueReceipt)] == [((UP0, 1),), ((UP0, 2),)]
        assert bodies(s, UP0) == [big.body, small.body]
    finally:
        await s.close()


async def test_a_group_waits_for_room_at_most_the_timeout_from_its_arrival(
    store_factory: StoreFactory, clock: ManualClock
) -> None:
    # Three messages that do not fit, waiting in turn: all are refused once the timeout has passed since the
    # group arrived, not after three timeouts one after the other.
    s = store_factory(endpoint_policies={"up": QueuePolicy(max_messages=1, enqueue_timeout_s=10)})
    try:
        await s.enqueue(m(0), [RouteResult("up", 0)])
        async with asyncio.timeout(10):
            group = asyncio.create_task(s.enqueue_many([(m(i), [RouteResult("up", 0)]) for i in (1, 2, 3)]))
            await clock.wait_for_sleepers(1)
            clock.advance(10)
            out = await group
        assert [type(r) for r in out] == [QuotaExceededError] * 3
        assert clock.monotonic() == 10
    finally:
        await s.close()


async def test_a_message_waiting_for_room_lets_the_ones_before_it_be_written_and_holds_the_ones_after(
    store_factory: StoreFactory, clock: ManualClock
) -> None:
    s = store_factory(endpoint_policies={"up": QueuePolicy(max_messages=2, enqueue_timeout_s=10)})
    try:
        async with asyncio.timeout(10):
            group = asyncio.create_task(s.enqueue_many([(m(i), [RouteResult("up", 0)]) for i in range(4)]))
            await clock.wait_for_sleepers(1)  # m2 waits for room
            # Group writes go in arrival order: once a later producer's is durable, so are m0 and m1.
            await s.enqueue(m(9), [RouteResult("other", 0)])
            assert s.end_offset(UP0) == 2  # m0 and m1 are written meanwhile
            assert s.next_offset(UP0) == 2  # m3 waits behind m2
            await s.commit(UP0, 1)  # delivered: their room is freed
            out = await group
        assert [type(r) for r in out] == [EnqueueReceipt] * 4
        assert bodies(s, UP0) == [m(2).body, m(3).body]
    finally:
        await s.close()
