"""Metadata carried by an enqueue is written in the message's own group write: durable exactly when the message
is accepted, never when it is refused or the write fails (the hub's duplicate window depends on it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgehub.core import Message, MessageTooLargeError, RouteResult, StorageIOError
from edgehub.store import QueueId, QueuePolicy
from edgehub.store.rocks import open_rocks_store
from tests.store.conftest import StoreFactory
from tests.store.fulldisk import fill, small_disk

__all__ = ["small_disk"]  # the fixture, imported for use here

pytestmark = pytest.mark.timeout(30)


async def test_metadata_given_with_an_enqueue_is_written_with_the_message_and_survives_a_reopen(
    store_factory: StoreFactory,
) -> None:
    s = store_factory()
    await s.put_metadata("dedup/old", b"1")
    receipt = await s.enqueue(
        Message(body=b"m"), [RouteResult("up", 0)], metadata={"dedup/new": b"2", "dedup/old": None}
    )
    assert receipt.refs == ((QueueId("up", 0), 0),)
    groups = s.groups_written
    assert s.metadata_items("dedup/") == [("dedup/new", b"2")]
    await s.close()
    s = store_factory()
    try:
        assert s.metadata_items("dedup/") == [("dedup/new", b"2")]
        assert groups == 1  # one group: the message and its metadata together
    finally:
        await s.close()


async def test_metadata_of_a_message_routed_nowhere_is_still_written(store_factory: StoreFactory) -> None:
    s = store_factory()
    try:
        receipt = await s.enqueue(Message(body=b"m"), [], metadata={"dedup/x": b"1"})
        assert receipt.refs == ()
        assert s.get_metadata("dedup/x") == b"1"
    finally:
        await s.close()


async def test_metadata_of_a_refused_message_is_not_written(store_factory: StoreFactory) -> None:
    s = store_factory(endpoint_policies={"up": QueuePolicy(max_message_size_bytes=10)})
    try:
        with pytest.raises(MessageTooLargeError):
            await s.enqueue(Message(body=b"x" * 100), [RouteResult("up", 0)], metadata={"dedup/x": b"1"})
        assert s.get_metadata("dedup/x") is None
    finally:
        await s.close()


async def test_metadata_keys_of_the_store_itself_are_refused(store_factory: StoreFactory) -> None:
    s = store_factory()
    try:
        with pytest.raises(ValueError, match="stats/"):
            await s.enqueue(Message(body=b"m"), [RouteResult("up", 0)], metadata={"stats/i/up": b""})
    finally:
        await s.close()


async def test_metadata_of_a_message_whose_write_failed_on_a_full_disk_is_not_written(small_disk: Path) -> None:
    store = open_rocks_store(small_disk / "db")
    try:
        fill(small_disk / "filler")
        with pytest.raises(StorageIOError, match="No space left"):
            await store.enqueue(Message(body=b"x" * 100_000), [RouteResult("up", 0)], metadata={"dedup/x": b"1"})
        (small_disk / "filler").unlink()
        assert store.get_metadata("dedup/x") is None
    finally:
        await store.close()
    reopened = open_rocks_store(small_disk / "db")
    try:
        assert reopened.get_metadata("dedup/x") is None
    finally:
        await reopened.close()
