"""``Store.read`` answers recently written references from memory: over both stores, what it returns must be
exactly what the database holds (written, not removed, after the committed offset), wherever the memory ends."""

from __future__ import annotations

from edgehub.core import Message, RouteResult
from edgehub.store import QueueId, RemovalReason, Store
from tests.store.conftest import StoreFactory

Q = QueueId("/modules/m/inputs/i", 0)
ROUTE = [RouteResult(Q.endpoint, 0)]


def m(i: int) -> Message:
    return Message(body=b"%d" % i, properties={"i": str(i)})


def offsets(store: Store, start: int = 0, limit: int = 1000) -> list[int]:
    return [it.offset for it in store.read(Q, start, limit)]


async def test_read_never_returns_what_was_removed_dead_lettered_or_committed(store: Store) -> None:
    await store.enqueue_many([(m(i), ROUTE) for i in range(10)])
    first = store.read(Q, 0, 10)
    assert [it.message.body for it in first] == [b"%d" % i for i in range(10)]
    assert first[4].message.properties == {"i": "4"}
    await store.remove(Q, [3], RemovalReason.TTL)
    await store.dead_letter(first[5], reason="invalid", attempts=1)
    assert offsets(store) == [0, 1, 2, 4, 6, 7, 8, 9]
    assert offsets(store, 2, 3) == [2, 4, 6]  # the gap is crossed by reading on from the database
    await store.commit(Q, 6)
    assert offsets(store) == [7, 8, 9]
    assert offsets(store, 8) == [8, 9]
    await store.enqueue_many([(m(10), ROUTE)])
    assert [it.message.body for it in store.read(Q, 0, 2)] == [b"7", b"8"]
    assert offsets(store) == [7, 8, 9, 10]


async def test_read_after_reopen_and_past_what_memory_holds_reads_the_database(store_factory: StoreFactory) -> None:
    store = store_factory()
    try:
        for start in range(0, 5000, 500):  # more than the store keeps in memory
            await store.enqueue_many([(m(i), ROUTE) for i in range(start, start + 500)])
        got = store.read(Q, 0, 5000)
        assert [it.offset for it in got] == list(range(5000))
        assert got[4999].message.body == b"4999"
        assert offsets(store, 4090, 10) == list(range(4090, 4100))
    finally:
        await store.close()
    store = store_factory()
    try:
        assert offsets(store, 10, 3) == [10, 11, 12]
        assert store.read(Q, 10, 1)[0].message.properties == {"i": "10"}
    finally:
        await store.close()
