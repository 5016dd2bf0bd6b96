"""The upload transport with zstd: ``*.jsonl.zst`` files, and a dictionary trained from the lane's traffic that is
landed once, before the first segment compressed with it, and found again after a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.core import FailureKind
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing.segment_store import MemorySegmentStore
from edgehub.upstream.batching import segment_bytes
from edgehub.upstream.dictionary import LaneDictionary
from edgehub.upstream.landing import LandingZone
from edgehub.upstream.segment import (
    Codec,
    UnknownDictionaryError,
    decode_segment,
    dictionary_id,
    dictionary_path,
    segment_codec,
    segment_dictionary_id,
)
from edgehub.upstream.upload_transport import UploadTransport
from tests.upstream.test_dictionary import telemetry_batch


def _lane(keeper: Store | None = None) -> LaneDictionary:
    # Trains after 100 sampled lines: 4 batches of 40 lines, 32 sampled from each.
    return LaneDictionary(lane="upload-upstream", keeper=keeper, min_lines=100)


async def _send_until_trained(up: UploadTransport, batches: int = 4, size: int = 40) -> int:
    for b in range(batches):
        result = await up.send(telemetry_batch(b * size, size))
        assert len(result.succeeded) == size
    await up.training_done()
    assert up.dictionary is not None
    assert up.dictionary.current is not None
    return batches * size


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_rocks_store(tmp_path / "db")
    yield s
    await s.close()


async def test_zstd_segments_land_as_jsonl_zst_files_that_decode_to_the_batch() -> None:
    landing = MemorySegmentStore()
    up = UploadTransport(landing, hub_id="hub1", codec=Codec.ZSTD)
    await up.send(telemetry_batch(0, 5))
    (path,) = landing.segments
    assert path == "hub1/upstream/p05/00000000000000000000-00000000000000000004.jsonl.zst"
    data = landing.segments[path]
    assert segment_codec(data) is Codec.ZSTD
    assert segment_dictionary_id(data) == 0
    assert [r.edge_message_id for r in decode_segment(data)] == [f"{i:032x}" for i in range(5)]


async def test_a_trained_dictionary_lands_once_before_the_first_segment_that_uses_it() -> None:
    landing = MemorySegmentStore()
    up = UploadTransport(landing, hub_id="hub1", codec=Codec.ZSTD, dictionary=_lane())
    first = await _send_until_trained(up)
    assert landing.files == {}  # trained, not landed: no segment has used it yet
    assert all(segment_dictionary_id(d) == 0 for d in landing.segments.values())
    assert up.dictionary is not None
    assert up.dictionary.usable is None
    await up.send(telemetry_batch(first, 40))
    await up.send(telemetry_batch(first + 40, 40))
    trained = up.dictionary.current
    assert trained is not None
    assert trained.announced
    assert up.dictionary.usable == trained
    dict_path = dictionary_path(trained.dict_id)
    assert landing.files == {dict_path: trained.data}
    assert dictionary_id(landing.files[dict_path]) == trained.dict_id
    assert up.dictionaries_landed == 1
    used = [p for p, d in landing.segments.items() if segment_dictionary_id(d) == trained.dict_id]
    assert len(used) == 2
    assert landing.order.index(dict_path) < min(landing.order.index(p) for p in used)
    with pytest.raises(UnknownDictionaryError, match=str(trained.dict_id)):
        decode_segment(landing.segments[used[0]])  # without the dictionary: refused, naming it
    records = decode_segment(landing.segments[used[0]], {trained.dict_id: landing.files[dict_path]})
    assert [r.edge_message_id for r in records] == [f"{i:032x}" for i in range(first, first + 40)]
    await up.close()


async def test_the_dictionary_makes_segments_smaller_than_gzip_of_the_same_batch() -> None:
    landing = MemorySegmentStore()
    up = UploadTransport(landing, hub_id="hub1", codec=Codec.ZSTD, dictionary=_lane())
    first = await _send_until_trained(up)
    batch = telemetry_batch(first, 40)
    result = await up.send(batch)
    zstd_bytes = int(result.details["wire_bytes"])
    assert segment_dictionary_id(landing.segments[result.details["segment"]]) != 0
    assert zstd_bytes < len(segment_bytes(batch, hub_id="hub1", lane="upstream"))
    await up.close()


async def test_a_failed_dictionary_write_fails_the_batch_and_the_next_try_lands_both() -> None:
    landing = MemorySegmentStore()
    up = UploadTransport(landing, hub_id="hub1", codec=Codec.ZSTD, dictionary=_lane())
    first = await _send_until_trained(up)
    segments_before = dict(landing.segments)
    landing.fail_next(1, FailureKind.TRANSIENT)
    failed = await up.send(telemetry_batch(first, 40))
    assert failed.failure_kind is FailureKind.TRANSIENT
    assert len(failed.failed) == 40
    assert landing.files == {}
    assert landing.segments == segments_before
    assert up.dictionary is not None
    assert up.dictionary.usable is None
    ok = await up.send(telemetry_batch(first, 40))
    assert len(ok.succeeded) == 40
    assert up.dictionary.usable is not None
    assert list(landing.files) == [dictionary_path(up.dictionary.usable.dict_id)]
    assert segment_dictionary_id(landing.segments[ok.details["segment"]]) == up.dictionary.usable.dict_id
    await up.close()


async def test_after_a_restart_the_kept_dictionary_is_used_and_landed_again_in_a_new_landing_zone(
    store: Store, tmp_path: Path
) -> None:
    up = UploadTransport(LandingZone(str(tmp_path / "a")), hub_id="hub1", codec=Codec.ZSTD, dictionary=_lane(store))
    first = await _send_until_trained(up)
    await up.send(telemetry_batch(first, 40))  # lands it, so the store marks it announced
    await up.close()
    assert up.dictionary is not None
    assert up.dictionary.usable is not None
    dict_id = up.dictionary.usable.dict_id

    zone = LandingZone(str(tmp_path / "b"))  # another landing zone: it has never seen the dictionary
    again = UploadTransport(zone, hub_id="hub1", codec=Codec.ZSTD, dictionary=_lane(store))
    assert again.dictionary is not None
    assert again.dictionary.usable is not None
    assert again.dictionary.usable.dict_id == dict_id
    result = await again.send(telemetry_batch(first + 40, 40))
    assert len(result.succeeded) == 40
    landed = zone.read_path(dictionary_path(dict_id))
    assert landed == again.dictionary.usable.data
    assert zone.list_paths("dictionaries") == [dictionary_path(dict_id)]
    data = (tmp_path / "b" / result.details["segment"]).read_bytes()
    assert segment_dictionary_id(data) == dict_id
    assert len(decode_segment(data, {dict_id: landed})) == 40
    await again.close()


def test_a_dictionary_with_gzip_or_a_level_out_of_range_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="zstd codec"):
        UploadTransport(MemorySegmentStore(), hub_id="h", dictionary=_lane())
    with pytest.raises(ValueError, match="out of range"):
        UploadTransport(MemorySegmentStore(), hub_id="h", codec=Codec.ZSTD, compresslevel=23)
    with pytest.raises(ValueError, match="out of range"):
        UploadTransport(MemorySegmentStore(), hub_id="h", compresslevel=10)
