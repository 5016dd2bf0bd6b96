"""A store on a full disk: the write that hits ENOSPC fails its group only, and the store stays usable.

The disk is a real 8 MB tmpfs filled with a real file (``tests.store.fulldisk``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgehub.core import Message, RouteResult, StorageIOError
from edgehub.store import QueueId
from edgehub.store.rocks import open_rocks_store
from tests.store.fulldisk import fill, small_disk

__all__ = ["small_disk"]  # the fixture, imported for use here


async def test_write_on_full_disk_fails_that_group_and_store_recovers(small_disk: Path) -> None:
    store = open_rocks_store(small_disk / "db")
    q = QueueId("up", 0)
    try:
        await store.enqueue(Message(body=b"before"), [RouteResult("up", 0)])
        fill(small_disk / "filler")
        with pytest.raises(StorageIOError, match="No space left"):
            await store.enqueue(Message(body=b"x" * 100_000), [RouteResult("up", 0)])
        (small_disk / "filler").unlink()
        await store.enqueue(Message(body=b"after"), [RouteResult("up", 0)])
        assert [it.message.body for it in store.read(q, 0, 10)] == [b"before", b"after"]
    finally:
        await store.close()
    reopened = open_rocks_store(small_disk / "db")
    try:
        assert [it.message.body for it in reopened.read(q, 0, 10)] == [b"before", b"after"]
    finally:
        await reopened.close()
