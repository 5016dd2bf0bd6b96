"""zstd segments in the job: the hub's upload transport lands zstd segments compressed with a dictionary trained
on its traffic (and the dictionary once); the job decodes them (``spark_upload.decoding``) and reads their records
as it reads gzip segments, deduplicated with them; a segment it cannot decode is quarantined, never a failed job."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from edgehub.delivery.endpoint import QueuedMessage
from edgehub.upstream.dictionary import LaneDictionary
from edgehub.upstream.landing import LandingZone
from edgehub.upstream.segment import (
    Codec,
    SegmentName,
    dictionary_path,
    encode_segment,
    record_from_message,
    segment_dictionary_id,
    segment_text,
)
from edgehub.upstream.upload_transport import UploadTransport
from spark_upload.decoding import UNDECODABLE_KEY, DecodePass, SegmentDecoder, decoded_path
from spark_upload.job import finish, run, start
from spark_upload.spark_internals import HadoopDir
from tests.spark_upload.checkpoints import job_settings
from tests.spark_upload.messages import assert_bronze_row_carries, expected_edge_message_id, queued_messages
from tests.upstream.test_dictionary import telemetry_batch

pytestmark = pytest.mark.spark


def _zstd_transport(landing: Path, lane: str = "upstream") -> UploadTransport:
    return UploadTransport(
        LandingZone(str(landing)),
        hub_id="hub1",
        lane=lane,
        codec=Codec.ZSTD,
        dictionary=LaneDictionary(lane=f"upload-{lane}", min_lines=100),
    )


async def _trained(up: UploadTransport, first: int = 0) -> list[QueuedMessage]:
    """Four batches of telemetry from offset ``first`` sent (plain zstd), and the dictionary trained from them."""
    sent = []
    for b in range(4):
        batch = telemetry_batch(first + b * 40, 40)
        assert len((await up.send(batch)).succeeded) == 40
        sent += batch
    await up.training_done()
    return sent


def _metrics(tmp_path: Path) -> list[dict[str, object]]:
    files = sorted((tmp_path / "lake" / "_metrics").glob("*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


async def test_zstd_segments_with_a_dictionary_and_gzip_segments_read_back_field_for_field_once_each(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    gz = UploadTransport(LandingZone(str(landing)), hub_id="hub1", lane="upstream-p1")
    zst = _zstd_transport(landing)
    varied = queued_messages(1000, 12, priority=3)  # binary, text and JSON bodies, null properties
    sent: dict[str, tuple[QueuedMessage, str]] = {}
    for qm in await _trained(zst):
        sent[expected_edge_message_id(qm, hub_id="hub1", lane="upstream")] = (qm, "upstream")
    with_dictionary = []
    for batch in (telemetry_batch(160, 40), varied):
        result = await zst.send(batch)
        assert len(result.succeeded) == len(batch)
        with_dictionary.append(result.details["segment"])
        for qm in batch:
            sent[expected_edge_message_id(qm, hub_id="hub1", lane="upstream")] = (qm, "upstream")
    assert zst.dictionaries_landed == 1
    assert all(segment_dictionary_id((landing / p).read_bytes()) for p in with_dictionary)
    # The same telemetry again, as gzip on another lane (a batch resent over another link): it lands twice.
    resent = telemetry_batch(160, 40)
    assert len((await gz.send(resent)).succeeded) == 40
    await zst.close()

    run(spark, job_settings(tmp_path))
    assert not (tmp_path / "lake" / "quarantine").exists()
    rows = {r.edge_message_id: r for r in spark.read.parquet(str(tmp_path / "lake" / "bronze")).collect()}
    assert sorted(rows) == sorted(sent)  # nothing lost, nothing twice
    for edge_id, (qm, lane) in sent.items():
        assert_bronze_row_carries(rows[edge_id], qm, hub_id="hub1", lane=lane)
    varied_id = expected_edge_message_id(varied[0], hub_id="hub1", lane="upstream")
    assert rows[varied_id].source_file.endswith(decoded_path(with_dictionary[1]))
    (m,) = [m for m in _metrics(tmp_path) if m["input_rows"]]
    assert (m["input_rows"], m["bronze_rows"], m["duplicates"], m["quarantined"]) == (
        len(sent) + 40,
        len(sent),
        40,
        0,
    )
    # A second run decodes nothing again and reads nothing again.
    copies = {p: p.stat().st_mtime_ns for p in (landing / "decoded").rglob("*.jsonl.gz")}
    assert len(copies) == 6  # four plain zstd segments, two with the dictionary
    run(spark, job_settings(tmp_path))
    assert {p: p.stat().st_mtime_ns for p in (landing / "decoded").rglob("*.jsonl.gz")} == copies
    assert spark.read.parquet(str(tmp_path / "lake" / "bronze")).count() == len(sent)


async def test_a_segment_whose_dictionary_is_missing_or_wrong_or_whose_frame_is_broken_is_quarantined_with_why(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    zst = _zstd_transport(landing)
    good = await _trained(zst)
    good_segment = next(p.relative_to(landing).as_posix() for p in landing.rglob("*.jsonl.zst"))
    first = await zst.send(telemetry_batch(160, 40))  # lands the dictionary, then this segment with it
    await zst.close()
    dict_id = segment_dictionary_id((landing / first.details["segment"]).read_bytes())
    dict_file = landing / dictionary_path(dict_id)
    # The dictionary lost from the landing zone: this segment cannot be read.
    missing = first.details["segment"]
    dict_bytes = dict_file.read_bytes()
    dict_file.unlink()
    # A second hub whose "dictionary" under its id is something else, and a broken frame.
    hub2 = _zstd_transport(tmp_path / "hub2-landing")
    await _trained(hub2, first=50_000)  # other traffic, so another dictionary
    wrong = await hub2.send(telemetry_batch(50_160, 40))
    await hub2.close()
    wrong_data = (tmp_path / "hub2-landing" / wrong.details["segment"]).read_bytes()
    wrong_id = segment_dictionary_id(wrong_data)
    assert wrong_id not in (0, dict_id)
    wrong_name = SegmentName("hub2", "upstream", 5, 50_160, 50_199, codec=Codec.ZSTD)
    zone = LandingZone(str(landing))
    zone.write(wrong_name, wrong_data)
    zone.write_path(dictionary_path(wrong_id), dict_bytes[:8] + b"not the trained dictionary")
    broken_name = SegmentName("hub3", "upstream", 5, 0, 9, codec=Codec.ZSTD)
    whole = (landing / good_segment).read_bytes()
    zone.write(broken_name, whole[: len(whole) // 2])  # a frame cut short
    unsized_name = SegmentName("hub4", "upstream", 5, 0, 9, codec=Codec.ZSTD)
    zone.write(unsized_name, b"\x28\xb5\x2f\xfd\x00garbage")  # states no size: no bound before decompressing

    run(spark, job_settings(tmp_path))  # does not fail

    quarantine = spark.read.parquet(str(tmp_path / "lake" / "quarantine")).collect()
    assert {r.reason for r in quarantine} == {UNDECODABLE_KEY}
    why = {json.loads(r.line)["segment"]: json.loads(r.line) for r in quarantine}
    assert set(why) == {missing, wrong_name.path, broken_name.path, unsized_name.path}
    assert (why[missing][UNDECODABLE_KEY], why[missing]["dict_id"]) == ("unknown_dictionary", dict_id)
    assert why[wrong_name.path][UNDECODABLE_KEY] == "bad_dictionary"
    assert why[broken_name.path][UNDECODABLE_KEY] == "broken_frame"
    assert why[unsized_name.path][UNDECODABLE_KEY] == "no_content_size"
    for r in quarantine:
        assert r.source_file.endswith(decoded_path(json.loads(r.line)["segment"]))
    # Every other segment's records are in bronze.
    ids = {r.edge_message_id for r in spark.read.parquet(str(tmp_path / "lake" / "bronze")).collect()}
    assert ids == {expected_edge_message_id(qm, hub_id="hub1", lane="upstream") for qm in good}
    (m,) = [m for m in _metrics(tmp_path) if m["input_rows"]]
    assert (m["quarantined"], m["duplicates"]) == (4, 0)


async def test_under_the_continuous_trigger_a_zstd_segment_landed_while_it_runs_is_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    zst = _zstd_transport(landing)
    sent = await _trained(zst)
    settings = replace(job_settings(tmp_path), trigger="continuous", processing_interval="1 second")
    query, state = start(spark, replace(settings, decode_interval_s=0.5))
    try:
        assert state.wait_for_batches(1, timeout_s=90)
        later = telemetry_batch(160, 40)
        result = await zst.send(later)  # lands the dictionary and a segment that needs it, while the job runs
        assert segment_dictionary_id((landing / result.details["segment"]).read_bytes())
        assert state.wait_for_batches(2, timeout_s=90)
    finally:
        query.stop()
        finish(spark, query, state)
        await zst.close()
    ids = sorted(r.edge_message_id for r in spark.read.parquet(str(tmp_path / "lake" / "bronze")).collect())
    assert ids == sorted(expected_edge_message_id(qm, hub_id="hub1", lane="upstream") for qm in [*sent, *later])


def test_a_segment_stating_more_than_the_bound_is_not_decompressed(spark: SparkSession, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    name = SegmentName("hub1", "upstream", 5, 0, 39, codec=Codec.ZSTD)
    records = [
        record_from_message(
            qm.message, hub_id="hub1", edge_message_id=f"e{qm.offset}", enqueued_at_s=1.8e9, priority=5, ttl_s=60
        )
        for qm in telemetry_batch(0, 40)
    ]
    data = encode_segment(records, codec=Codec.ZSTD)
    LandingZone(str(landing)).write(name, data)
    decoder = SegmentDecoder(HadoopDir(spark, str(landing)), max_segment_bytes=1000)
    whole = SegmentDecoder(HadoopDir(spark, str(landing)))
    try:
        assert decoder.run_pass() == DecodePass(decoded=0, undecodable=1)
        (line,) = gzip.decompress((landing / decoded_path(name.path)).read_bytes()).splitlines()
        why = json.loads(line)
        assert (why[UNDECODABLE_KEY], why["segment"]) == ("too_large", name.path)
        assert decoder.run_pass() == DecodePass()  # decided once
        # Within the bound, the same segment decodes to its lines.
        LandingZone(str(landing)).write(replace(name, hub_id="hub2"), data)
        assert whole.run_pass() == DecodePass(decoded=1)
    finally:
        decoder.stop()
        whole.stop()
    copy = gzip.decompress((landing / decoded_path(replace(name, hub_id="hub2").path)).read_bytes())
    assert copy == segment_text(records)


def test_a_pass_decodes_at_most_its_bound_and_leaves_the_rest_for_the_next(spark: SparkSession, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    zone = LandingZone(str(landing))
    for k in range(5):
        records = [
            record_from_message(
                telemetry_batch(k, 1)[0].message,
                hub_id="hub1",
                edge_message_id=f"e{k}",
                enqueued_at_s=1.8e9,
                priority=5,
                ttl_s=60,
            )
        ]
        zone.write(
            SegmentName("hub1", "upstream", 5, k, k, codec=Codec.ZSTD), encode_segment(records, codec=Codec.ZSTD)
        )
    decoder = SegmentDecoder(HadoopDir(spark, str(landing)), max_segments_per_pass=2)
    try:
        passes = [decoder.run_pass() for _ in range(4)]
    finally:
        decoder.stop()
    assert passes == [
        DecodePass(decoded=2, left=3),
        DecodePass(decoded=2, left=1),
        DecodePass(decoded=1),
        DecodePass(),
    ]
    assert len(list((landing / "decoded").rglob("*.jsonl.gz"))) == 5
