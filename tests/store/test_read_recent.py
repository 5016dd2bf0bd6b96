"""``Store.read`` answers recently written references from memory: over both stores, what it returns must be
exactly what the database holds (written, not removed, after the committed offset), wherever the memory ends."""

from __future__ import annotations

import asyncio
import threading

import pytest

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


async def test_read_durable_in_a_worker_thread_returns_whole_references_while_the_loop_writes_and_removes(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """``read_durable`` is the part of a read an executor runs in a worker thread: while the loop ingests,
    commits and removes on the same queue, every read returns references in offset order, each with its own
    message, and a read after the writes returns what ``read`` does. (A reference whose body a removal deleted
    between the two reads of ``read_durable`` is left out, without an error.)"""
    for i in range(100):
        await store.enqueue(m(i), ROUTE)
    stop = threading.Event()
    reads: list[list[tuple[int, bytes]]] = []

    def reader() -> None:
        while not stop.is_set():
            reads.append([(it.offset, it.message.body) for it in store.read_durable(Q, 0, 1000)])

    async with asyncio.timeout(30):
        thread = asyncio.create_task(asyncio.to_thread(reader))
        try:
            for i in range(100, 400):
                await store.enqueue(m(i), ROUTE)
                if i % 25 == 0:
                    await store.commit(Q, i - 60)
                    await store.remove_delivered(Q)
                    await store.remove(Q, [i - 55], RemovalReason.TTL)
        finally:
            stop.set()
            await thread
        start = store.checkpoint(Q).committed + 1
        after = await asyncio.to_thread(store.read_durable, Q, start, 1000)
    assert len(reads) > 1
    for read in reads:
        assert [o for o, _ in read] == sorted({o for o, _ in read})
        assert all(body == b"%d" % o for o, body in read)
    # The same references and messages as the loop's read (which has some from memory, marked sole_reference).
    assert [(it.offset, it.message) for it in after] == [(it.offset, it.message) for it in store.read(Q, 0, 1000)]
    assert after[0].offset == start
    assert "store.missing_body" not in caplog.text  # a race with a removal is not a missing body
