"""What the store reads at open instead of scanning (usage per endpoint, per identity and store-wide, and each
queue's next offset) over both backends: after every kind of write and a reopen, each figure equals the one a full scan
of the data finds, and the old-store path (no identity counters) reaches the same figures by its one-time count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from edgehub.core import Message, RouteResult
from edgehub.store import MemoryBackend, Overflow, QueueId, QueuePolicy, RemovalReason, Store
from edgehub.store.backend import Backend
from edgehub.store.rocks import RocksBackend
from tests.store.figures import assert_open_figures_match_a_scan

pytestmark = pytest.mark.timeout(60)

UP = QueueId("up", 0)
SIDE = QueueId("side", 5)
ROUTES = [RouteResult("up", 0), RouteResult("side", 5)]
Opener = Callable[[], Backend]


@pytest.fixture(params=["memory", "rocksdb"])
def open_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the backend; calling it again after ``close`` reopens the same data, as a restart would."""
    memory = MemoryBackend()
    if request.param == "memory":
        return memory.reopened
    return lambda: RocksBackend(tmp_path / "db")


def msg(n: int, device: str, module: str | None = None) -> Message:
    sp = {"connectionDeviceId": device}
    if module is not None:
        sp["connectionModuleId"] = module
    return Message(b"m%d" % n + b"." * (n % 7), {}, sp)


async def write_every_kind(store: Store) -> None:
    """Groups from two devices and a module, then delivery, cleanup, TTL removal, dead letters (moved, requeued,
    purged) and an overflow that discards the oldest."""
    for n in range(0, 24, 4):
        group = [(msg(n, "devA"), ROUTES), (msg(n + 1, "devB"), ROUTES), (msg(n + 2, "devA", "mod"), ROUTES)]
        await store.enqueue_many([*group, (msg(n + 3, "devB"), ROUTES[:1])])
    first = store.read(UP, 0, 5)
    await store.commit(UP, first[-1].offset)
    await store.remove_delivered(UP)
    await store.remove(SIDE, [0, 3], RemovalReason.TTL)
    for item in store.read(SIDE, 4, 4):
        await store.dead_letter(item, reason="invalid", attempts=1)
    letters = store.dead_letters("side")
    await store.requeue_dead_letters("side", [letters[0].dlq_offset])
    await store.purge_dead_letters("side", [letters[1].dlq_offset])


async def test_the_figures_read_at_open_equal_a_full_scan_after_every_kind_of_write(open_backend: Opener) -> None:
    store = Store(open_backend())
    try:
        await write_every_kind(store)
    finally:
        await store.close()
    backend = open_backend()
    store = Store(
        backend,
        endpoint_policies={"up": QueuePolicy(max_messages=20, overflow=Overflow.DISCARD_OLDEST, enqueue_timeout_s=0)},
    )
    try:
        assert_open_figures_match_a_scan(store, backend)
        await store.enqueue_many([(msg(100 + n, "devC"), ROUTES) for n in range(8)])  # up overflows: oldest go
        assert store.removed[RemovalReason.OVERFLOW] > 0
    finally:
        await store.close()
    backend = open_backend()
    store = Store(backend)
    try:
        assert_open_figures_match_a_scan(store, backend)
    finally:
        await store.close()


async def test_a_store_without_identity_counters_is_counted_once_to_the_figures_of_a_scan(
    open_backend: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(open_backend())
    try:
        await write_every_kind(store)
    finally:
        await store.close()
    backend = open_backend()
    # What a build from before identities were counted left: no identity counters, no marker.
    old = [k for k, _ in backend.scan("meta", b"stats/", 1 << 30) if b"\x00" in k or k == b"stats/identities-counted"]
    assert old
    backend.write([("meta", k, None) for k in old], sync=True)
    backend.close()
    for _ in range(2):  # the first open counts; the second reads what the first wrote
        backend = open_backend()
        with caplog.at_level(logging.INFO, logger="edgehub.store.usage"):
            store = Store(backend)
        try:
            assert_open_figures_match_a_scan(store, backend)
        finally:
            await store.close()
    counted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("store.identities_counted ")]
    assert len(counted) == 1
    assert "identities=3 messages=" in counted[0]  # devA, devB, devA/mod
