"""The upload transport: one idempotently named segment per batch; the write is the checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edgehub.core import FailureKind, Message
from edgehub.delivery.endpoint import Endpoint, QueuedMessage
from edgehub.testing.segment_store import MemorySegmentStore
from edgehub.upstream.segment import decode_segment
from edgehub.upstream.upload_transport import UploadTransport


def _batch(first: int, n: int, priority: int = 3) -> list[QueuedMessage]:
    return [
        QueuedMessage(
            message=Message(body=b"b%d" % i, system_properties={"edgeMessageId": f"e-{i}"}),
            offset=i,
            priority=priority,
            enqueued_at_s=1.7e9 + i,
            ttl_s=60,
        )
        for i in range(first, first + n)
    ]


def test_upload_transport_is_an_endpoint() -> None:
    assert isinstance(UploadTransport(MemorySegmentStore(), hub_id="hub1"), Endpoint)


async def test_a_batch_lands_as_one_segment_named_after_what_it_is() -> None:
    store = MemorySegmentStore()
    up = UploadTransport(store, hub_id="hub1", lane="upstream-p2")
    result = await up.send(_batch(10, 5))
    assert [m.offset for m in result.succeeded] == [10, 11, 12, 13, 14]
    path = "hub1/upstream-p2/p03/00000000000000000010-00000000000000000014.jsonl.gz"
    assert list(store.segments) == [path]
    assert result.details["segment"] == path
    assert [r.edge_message_id for r in decode_segment(store.segments[path])] == [f"e-{i}" for i in range(10, 15)]


async def test_the_same_batch_uploaded_twice_yields_one_file_with_the_same_bytes() -> None:
    store = MemorySegmentStore()
    up = UploadTransport(store, hub_id="hub1")
    await up.send(_batch(0, 3))
    first = dict(store.segments)
    await up.send(_batch(0, 3))
    assert store.writes == 2
    assert store.segments == first


async def test_a_failed_write_fails_the_whole_batch_with_its_kind_and_the_next_success_reports_reachable() -> None:
    store = MemorySegmentStore()
    reachable: list[bool] = []
    up = UploadTransport(store, hub_id="hub1")
    up.bind(lambda: reachable.append(True))
    store.fail_next(1, FailureKind.PERMANENT)
    failed = await up.send(_batch(0, 2))
    assert not failed.succeeded
    assert [m.offset for m in failed.failed] == [0, 1]
    assert failed.failure_kind is FailureKind.PERMANENT
    assert store.segments == {}
    assert reachable == []
    ok = await up.send(_batch(0, 2))
    assert len(ok.succeeded) == 2
    assert reachable == [True]


async def test_an_outage_is_logged_once_with_its_reason_and_once_more_when_a_write_lands_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemorySegmentStore()
    up = UploadTransport(store, hub_id="hub1")
    store.fail_next(5, FailureKind.TRANSIENT)
    with caplog.at_level(logging.DEBUG, logger="edgehub.upstream.upload_transport"):
        for _ in range(5):
            assert (await up.send(_batch(0, 2))).failed
        assert len((await up.send(_batch(0, 2))).succeeded) == 2
        store.fail_next(1, FailureKind.TRANSIENT)
        assert (await up.send(_batch(2, 1))).failed
    lines = [(r.levelno, r.getMessage().split(" ", 1)[0]) for r in caplog.records]
    assert lines == [
        (logging.WARNING, "upload.failing"),
        *[(logging.DEBUG, "upload.write_failed")] * 4,
        (logging.INFO, "upload.recovered"),
        (logging.WARNING, "upload.failing"),  # a new outage is said again
    ]
    assert "failed_writes=5 " in caplog.records[5].getMessage()
    assert "reason=error kind=transient" in caplog.records[0].getMessage()


async def test_an_outage_whose_reason_changes_is_said_again_with_the_new_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemorySegmentStore()
    up = UploadTransport(store, hub_id="hub1")
    with caplog.at_level(logging.INFO, logger="edgehub.upstream.upload_transport"):
        for kind in (FailureKind.TRANSIENT, FailureKind.TRANSIENT, FailureKind.TIMEOUT, FailureKind.TIMEOUT):
            store.fail_next(1, kind)
            assert (await up.send(_batch(0, 1))).failed
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert "reason=error kind=transient" in said[0]
    assert "reason=timeout kind=timeout" in said[1]


async def test_a_batch_mixing_priorities_is_refused_without_writing() -> None:
    store = MemorySegmentStore()
    up = UploadTransport(store, hub_id="hub1")
    result = await up.send([*_batch(0, 1, priority=1), *_batch(1, 1, priority=2)])
    assert len(result.failed) == 2
    assert store.writes == 0


async def test_with_the_landing_zone_a_retried_upload_leaves_one_file(tmp_path: Path) -> None:
    # Runs once edgehub.upstream.landing (another branch) is merged: LandingZone(url).write(name, data).
    landing = pytest.importorskip("edgehub.upstream.landing")
    zone = landing.LandingZone(str(tmp_path / "landing"))
    up = UploadTransport(zone, hub_id="hub1")
    assert len((await up.send(_batch(0, 4))).succeeded) == 4
    assert len((await up.send(_batch(0, 4))).succeeded) == 4
    files = [p for p in (tmp_path / "landing").rglob("*") if p.is_file()]
    assert [p.name for p in files] == ["00000000000000000000-00000000000000000003.jsonl.gz"]
    assert len(decode_segment(files[0].read_bytes())) == 4
