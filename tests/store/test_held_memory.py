"""What the store charges for the messages it holds in memory for readers (``held_in_memory``) is at least what
they take: the 16 MiB bound is a bound on memory, not on an estimate below it. Measured with tracemalloc on a
RocksDB store, whose data is outside Python's heap (an in-memory backend would count its own copies)."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

from edgehub.core import Message, RouteResult
from edgehub.store import QueueId
from edgehub.store.rocks import open_rocks_store

Q = QueueId("/modules/m/inputs/i", 0)
ROUTE = [RouteResult(Q.endpoint, 0)]
DEVICE = {"connectionDeviceId": "sensor-7", "connectionAuthMethod": '{"scope":"device","type":"sas"}'}


def telemetry(i: int, app_properties: int) -> Message:
    """A device's 200-byte message as the hub holds it, with application properties of its own (unique values:
    nothing shared with other messages)."""
    props: dict[str, str | None] = {f"p{k}": f"value-{i}-{k}" for k in range(app_properties)}
    return Message(body=b"%08d" % i * 25, properties=props, system_properties={**DEVICE, "messageId": f"m-{i}"})


@pytest.mark.parametrize("app_properties", [0, 10])
async def test_the_bytes_charged_for_held_messages_cover_what_they_take(tmp_path: Path, app_properties: int) -> None:
    store = open_rocks_store(tmp_path / "db")
    try:
        # Warm: the first groups create the queue, its caches and the writer thread.
        for g in range(5):
            await store.enqueue_many([(telemetry(g * 50 + i, app_properties), ROUTE) for i in range(50)])
        gc.collect()
        tracemalloc.start()
        try:
            held0, charged0 = store.held_in_memory
            before = tracemalloc.get_traced_memory()[0]
            for g in range(40):
                batch = [(telemetry(1000 + g * 50 + i, app_properties), ROUTE) for i in range(50)]
                await store.enqueue_many(batch)
            del batch
            gc.collect()
            taken = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        held, charged = store.held_in_memory
        assert held - held0 == 2000  # all of them held: far from either bound
        assert charged - charged0 >= taken, (charged - charged0) / 2000
    finally:
        await store.close()
