"""The bound on messages the store holds in memory for its readers is the one it is given (a hardware profile
lowers it on a small board), and what it does not hold is read back from the database: every message is still
read, in order."""

from __future__ import annotations

from pathlib import Path

from edgehub.core import Message, RouteResult
from edgehub.store import QueueId
from edgehub.store.held import MAX_BYTES
from edgehub.store.rocks import open_rocks_store

Q = QueueId("$upstream", 5)
ROUTE = [RouteResult(Q.endpoint, Q.priority)]


def message(i: int) -> Message:
    return Message(body=b"%08d" % i * 25, system_properties={"connectionDeviceId": "dev1", "messageId": f"m{i}"})


async def test_the_store_holds_no_more_than_its_held_bound_and_reads_the_rest_from_the_database(
    tmp_path: Path,
) -> None:
    store = open_rocks_store(tmp_path / "db", held_max_bytes=8 << 10)
    try:
        await store.enqueue_many([(message(i), ROUTE) for i in range(200)])
        held, charged = store.held_in_memory
        assert 0 < held < 200
        assert charged <= 8 << 10
        items = store.read(Q, 0, 500)
        assert [item.message.body for item in items] == [message(i).body for i in range(200)]
    finally:
        await store.close()


async def test_the_default_held_bound_holds_them_all(tmp_path: Path) -> None:
    store = open_rocks_store(tmp_path / "db")
    try:
        await store.enqueue_many([(message(i), ROUTE) for i in range(200)])
        held, charged = store.held_in_memory
        assert held == 200
        assert charged < MAX_BYTES
    finally:
        await store.close()
