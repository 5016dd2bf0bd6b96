"""A lane's zstd dictionary: trained from a bounded sample of its own segments, kept in the store, usable only
once the far side has it, retrained when the ratio drifts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.core import Message
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing.clock import ManualClock
from edgehub.upstream.batching import batch_text
from edgehub.upstream.dictionary import LaneDictionary, TrainedDictionary


def telemetry_batch(first: int, n: int) -> list[QueuedMessage]:
    out = []
    for i in range(first, first + n):
        body = {"deviceId": f"pump-{i % 7}", "seq": i, "temperature": 20 + (i * 37 % 100) / 10, "status": "ok"}
        msg = Message(
            body=json.dumps(body, separators=(",", ":")).encode(),
            system_properties={"edgeMessageId": f"{i:032x}", "connectionDeviceId": "pump"},
        )
        out.append(QueuedMessage(message=msg, offset=i, priority=5, enqueued_at_s=1.79e9 + i, ttl_s=3600))
    return out


def texts(batches: int, size: int = 40) -> list[bytes]:
    return [batch_text(telemetry_batch(b * size, size), hub_id="edge", lane="upstream") for b in range(batches)]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_rocks_store(tmp_path / "db")
    yield s
    await s.close()


async def test_a_lane_trains_keeps_its_dictionary_in_the_store_and_uses_it_only_once_announced(
    store: Store,
) -> None:
    ld = LaneDictionary(lane="upstream", keeper=store, min_lines=100)
    for text in texts(3):
        ld.observe(text)
    assert not ld.wants_training()  # 3 x 32 lines sampled: below min_lines
    for text in texts(2):
        ld.observe(text)
    assert ld.wants_training()
    trained = await ld.train()
    assert trained is not None
    assert ld.pending == trained
    assert ld.usable is None  # not before the far side has it
    await ld.announced(trained.dict_id)
    usable = ld.usable
    assert usable is not None
    assert usable.dict_id == trained.dict_id
    # A restart finds it in the store, announced: it is not sent again and is used at once.
    again = LaneDictionary(lane="upstream", keeper=store)
    assert again.usable is not None
    assert again.usable.data == trained.data
    assert LaneDictionary(lane="upstream-p1", keeper=store).current is None  # one per lane


async def test_each_far_side_acknowledges_the_lane_dictionary_on_its_own_and_a_restart_remembers_which(
    store: Store,
) -> None:
    ld = LaneDictionary(lane="upstream", keeper=store, min_lines=100)
    for text in texts(5):
        ld.observe(text)
    trained = await ld.train()
    assert trained is not None

    def ids(*dicts: TrainedDictionary | None) -> list[int | None]:
        return [d.dict_id if d is not None else None for d in dicts]

    await ld.announced(trained.dict_id)  # the first link's far side
    assert ids(ld.usable_at(None), ld.usable_at("sat")) == [trained.dict_id, None]  # the other link's has not
    assert ids(ld.pending_at("sat")) == [trained.dict_id]
    await ld.announced(trained.dict_id, "sat")
    assert ids(ld.usable_at("sat"), ld.pending_at("radio")) == [trained.dict_id] * 2  # a third still waits
    again = LaneDictionary(lane="upstream", keeper=store, min_lines=100)
    assert ids(again.usable_at(None), again.usable_at("sat"), again.usable_at("radio")) == [trained.dict_id] * 2 + [
        None
    ]
    # A new dictionary (other traffic) is every side's to receive again.
    for b in range(5):
        again.observe(batch_text(telemetry_batch(90_000 + b * 40, 40), hub_id="ship-7", lane="upstream-p1"))
    retrained = await again.train()
    assert retrained is not None
    assert retrained.dict_id != trained.dict_id
    assert ids(again.pending_at(None), again.pending_at("sat")) == [retrained.dict_id] * 2
    assert again.usable_at("sat") is None


async def test_one_training_at_a_time_for_the_links_that_share_a_lane() -> None:
    ld = LaneDictionary(lane="upstream", min_lines=100)
    for text in texts(5):
        ld.observe(text)
    first, second = await asyncio.gather(ld.train(), ld.train())
    assert first is not None
    assert second is None  # the second link found it training
    assert ld.trainings == 1


async def test_the_sample_stays_within_its_line_and_byte_bounds() -> None:
    ld = LaneDictionary(lane="upstream", sample_lines=500, sample_bytes=20_000, min_lines=10)
    for text in texts(100):
        ld.observe(text)
    assert ld.sample_size <= 500
    assert ld.sample_bytes_held <= 20_000


async def test_a_ratio_that_drifts_calls_for_a_new_dictionary_at_most_once_per_interval() -> None:
    clock = ManualClock()
    ld = LaneDictionary(lane="upstream", clock=clock, min_lines=50, baseline_segments=5, min_retrain_interval_s=600)
    for text in texts(4):
        ld.observe(text)
    trained = await ld.train()
    assert trained is not None
    await ld.announced(trained.dict_id)
    for _ in range(5):
        ld.record(1000, 300)  # the baseline: 0.3
    assert not ld.wants_training()
    for _ in range(100):
        ld.record(1000, 600)  # twice as bad: the traffic changed
    assert not ld.wants_training()  # drifted, but trained less than min_retrain_interval_s ago
    clock.advance(600)
    assert ld.wants_training()
    retrained = await ld.train()
    assert retrained is not None
    assert ld.pending == retrained
    assert ld.trainings == 2
