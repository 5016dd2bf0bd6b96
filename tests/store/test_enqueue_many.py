"""``Store.enqueue_many``, over both stores: a producer's group in one durable write, with a receipt or a refusal
per message in order, and the same answers ``enqueue`` gives, also when policies apply."""

from __future__ import annotations

from edgehub.core import Message, MessageTooLargeError, QuotaExceededError, RouteResult
from edgehub.store import EnqueueReceipt, QueueId, QueuePolicy, Store
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
    assert all(r.message.edge_message_id for r in receipts)
    assert len({r.message.edge_message_id for r in receipts}) == 4
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
