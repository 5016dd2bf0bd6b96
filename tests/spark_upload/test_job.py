from __future__ import annotations

import base64
import gzip
import json
import typing
from collections.abc import Mapping
from dataclasses import replace
from datetime import date, timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from edgehub import Message
from edgehub.upstream.landing import LandingZone
from edgehub.upstream.segment import (
    BODY_FIELDS,
    LINE_FIELDS,
    RECORD_FIELDS,
    SegmentName,
    SegmentRecord,
    encode_segment,
    record_from_message,
)
from edgehub.upstream.upload_transport import UploadTransport
from spark_upload.classification import BRONZE_COLUMNS, RECORD_SCHEMA
from spark_upload.compaction import compact
from spark_upload.job import finish, run, start
from spark_upload.sink import CheckpointMismatchError
from spark_upload.tables import device_minute_stats
from tests.spark_upload.checkpoints import forget_batches, job_settings
from tests.spark_upload.messages import assert_bronze_row_carries, expected_edge_message_id, queued_messages

BASE_S = 1_795_000_020.0  # 2026-11-18T11:07:00Z, a whole minute


def _record(i: int, *, device: str = "dev1", body: bytes | None = None, second: float = 0.0) -> SegmentRecord:
    msg = Message(
        body=body if body is not None else json.dumps({"temp": 20 + i, "hum": 0.5, "label": "x"}).encode(),
        properties={"alert": "yes", "nothing": None},
        system_properties={"connectionDeviceId": device, "connectionModuleId": "m1", "messageId": f"m-{i}"},
    )
    return record_from_message(
        msg, hub_id="hub1", edge_message_id=f"e-{i:06d}", enqueued_at_s=BASE_S + second, priority=3, ttl_s=60.5
    )


def _land(zone: LandingZone, first: int, last: int, *, lane: str = "upstream") -> list[SegmentRecord]:
    records = [_record(i) for i in range(first, last + 1)]
    zone.write(SegmentName("hub1", lane, 3, first, last), encode_segment(records))
    return records


def _metrics(tmp_path: Path) -> list[dict[str, object]]:
    """Every metrics line the job wrote to the lake, in file name order (batch, then time)."""
    files = sorted((tmp_path / "lake" / "_metrics").glob("*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def _bronze_ids(spark: SparkSession, tmp_path: Path) -> list[str]:
    rows = spark.read.parquet(str(tmp_path / "lake" / "bronze")).select("edge_message_id").collect()
    return sorted(r.edge_message_id for r in rows)


# How each SegmentRecord field is written in a JSON line (bytes as base64 or text, the time as an ISO string), and
# so the Spark type that reads it.
_SPARK_TYPE_OF_RECORD_TYPE: dict[object, str] = {
    int: "int",
    float: "double",
    str: "string",
    str | None: "string",
    bytes: "string",
    Mapping[str, str | None]: "map<string,string>",
    Mapping[str, str]: "map<string,string>",
}


def test_spark_schema_is_in_step_with_the_segment_record_fields_and_their_types() -> None:
    # The parse schema holds every field of every line version we read: v1's, then v2's body fields.
    assert LINE_FIELDS[1] == RECORD_FIELDS
    assert tuple(f.name for f in RECORD_SCHEMA.fields) == (*RECORD_FIELDS, *BODY_FIELDS)
    assert set(LINE_FIELDS[2]) == set(RECORD_FIELDS) - {"body"} | set(BODY_FIELDS)
    assert BRONZE_COLUMNS[: len(RECORD_FIELDS)] == RECORD_FIELDS
    record_types = {"v": int, **typing.get_type_hints(SegmentRecord)}  # v is SEGMENT_FORMAT_VERSION, an int
    assert set(record_types) == set(RECORD_FIELDS)
    line_types = {**record_types, **dict.fromkeys(BODY_FIELDS, bytes)}  # body_json: any JSON value, read as text
    spark_types = {f.name: f.dataType.simpleString() for f in RECORD_SCHEMA.fields}
    assert spark_types == {name: _SPARK_TYPE_OF_RECORD_TYPE[line_types[name]] for name in line_types}


# Bronze holds the record typed: the time as a timestamp, the body as its bytes.
_BRONZE_TYPES = {
    "v": "int",
    "edge_message_id": "string",
    "message_id": "string",
    "device_id": "string",
    "module_id": "string",
    "hub_id": "string",
    "enqueued_at": "timestamp",
    "priority": "int",
    "ttl_s": "double",
    "source": "string",
    "properties": "map<string,string>",
    "system_properties": "map<string,string>",
    "body": "binary",
    "source_file": "string",
    "ingest_at": "timestamp",
    "ingest_date": "date",
}


@pytest.mark.spark
async def test_segments_uploaded_by_the_hubs_upload_transport_read_back_field_for_field(
    spark: SparkSession, tmp_path: Path
) -> None:
    transport = UploadTransport(LandingZone(str(tmp_path / "landing")), hub_id="hub1")
    batches = [queued_messages(0, 10, priority=3), queued_messages(10, 3, priority=0)]
    segments = {}
    for batch in batches:
        result = await transport.send(batch)
        assert result.succeeded == tuple(batch)
        for qm in batch:
            segments[expected_edge_message_id(qm, hub_id="hub1", lane="upstream")] = result.details["segment"]
    # What the receiver sets aside is not a segment and must not reach (or stop) the job.
    LandingZone(str(tmp_path / "landing")).write_path("rejected/0123.bin", b"not gzip at all")
    run(spark, job_settings(tmp_path))
    assert not (tmp_path / "lake" / "quarantine").exists()

    bronze = spark.read.parquet(str(tmp_path / "lake" / "bronze"))
    assert dict(bronze.dtypes) == _BRONZE_TYPES
    rows = {r.edge_message_id: r for r in bronze.collect()}
    sent = [qm for batch in batches for qm in batch]
    assert sorted(rows) == sorted(segments)
    for qm in sent:
        edge_id = expected_edge_message_id(qm, hub_id="hub1", lane="upstream")
        assert_bronze_row_carries(rows[edge_id], qm, hub_id="hub1", lane="upstream")
        assert rows[edge_id].source_file.endswith("/landing/" + segments[edge_id])
    assert _metrics(tmp_path)[0] == {
        **_metrics(tmp_path)[0],
        "input_rows": 13,
        "bronze_rows": 13,
        "duplicates": 0,
        "quarantined": 0,
    }


@pytest.mark.spark
def test_duplicates_by_edge_message_id_are_removed_across_segments_and_batches(
    spark: SparkSession, tmp_path: Path
) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, 0, 9)
    _land(zone, 5, 14)  # a batch cut differently after a restart overlaps the first
    settings = job_settings(tmp_path)
    run(spark, settings)
    _land(zone, 0, 9, lane="upstream-p1")  # the same messages retried under another name, in a later batch
    _land(zone, 15, 19)
    # Another hub's ids are its own: the same edge_message_id from hub2 is a different message.
    other = [replace(r, hub_id="hub2") for r in (_record(0), _record(1))]
    zone.write(SegmentName("hub2", "upstream", 3, 0, 1), encode_segment(other))
    run(spark, settings)

    rows = spark.read.parquet(str(tmp_path / "lake" / "bronze")).select("hub_id", "edge_message_id").collect()
    assert sorted((r.hub_id, r.edge_message_id) for r in rows) == [("hub1", f"e-{i:06d}") for i in range(20)] + [
        ("hub2", "e-000000"),
        ("hub2", "e-000001"),
    ]
    metrics = [m for m in _metrics(tmp_path) if m["input_rows"]]
    assert [(m["input_rows"], m["bronze_rows"], m["duplicates"]) for m in metrics] == [(20, 15, 5), (17, 7, 10)]


def _v1_obj(r: SegmentRecord) -> dict[str, object]:
    """The record as the v1 writer wrote it (edgehub.upstream.segment's docstring, v1 rows)."""
    obj: dict[str, object] = {k: v for k, v in r.to_json_obj().items() if k not in BODY_FIELDS}
    return {**obj, "v": 1, "system_properties": dict(r.system_properties), "body": base64.b64encode(r.body).decode()}


@pytest.mark.spark
def test_each_kind_of_bad_record_is_quarantined_with_its_reason_and_the_job_keeps_going(
    spark: SparkSession, tmp_path: Path
) -> None:
    good = replace(_record(1), body=b'{"temp":21,"hum":0.5}').to_json_obj()  # v2, body_json
    good_v1 = _v1_obj(_record(2))

    def line(base: dict[str, object] = good, **changes: object) -> str:
        obj = {**base, **changes}
        return json.dumps({k: v for k, v in obj.items() if v != "DROP"})

    body = good["body_json"]
    lines = {
        "empty_line": "   ",
        "unparseable_line": "{not json",
        "unparseable_line ": "[1, 2]",
        "unsupported_version": line(v=3, edge_message_id="bad-v"),
        "unsupported_version ": line(good_v1, v=None, edge_message_id="bad-v1"),
        "malformed_record": line(priority="high", edge_message_id="bad-prio"),
        "malformed_record ": line(good_v1, priority="high", edge_message_id="bad-prio-v1"),
        "missing_fields:edge_message_id,body": line(good_v1, edge_message_id="DROP", body="DROP"),
        "missing_fields:hub_id": line(hub_id=None, edge_message_id="bad-hub"),
        "bad_enqueued_at": line(enqueued_at="yesterday", edge_message_id="bad-time"),
        "body_not_base64": line(good_v1, body="%%%not-base64%%%", edge_message_id="bad-body"),
        "body_not_base64 ": line(body_json="DROP", body_b64="%%%", edge_message_id="bad-body-v2"),
        "no_body_field": line(body_json="DROP", edge_message_id="no-body"),
        "several_body_fields": line(body_text="also", edge_message_id="two-bodies"),
        "body_json_not_last": json.dumps({"body_json": body, **{k: v for k, v in good.items() if k != "body_json"}}),
    }
    v2_text = {k: v for k, v in _record(3).to_json_obj().items() if k not in BODY_FIELDS} | {"body_text": "hi"}
    goods = [json.dumps(good), json.dumps(good_v1), json.dumps(v2_text)]
    text = "\n".join([goods[0], *lines.values(), *goods[1:]]) + "\n"
    folder = tmp_path / "landing" / "hub1" / "upstream" / "p03"
    folder.mkdir(parents=True)
    (folder / "bad.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    run(spark, job_settings(tmp_path))

    quarantine = spark.read.parquet(str(tmp_path / "lake" / "quarantine")).collect()
    got = sorted((r.reason, r.line) for r in quarantine)
    assert got == sorted((reason.strip(), raw) for reason, raw in lines.items())
    assert all(r.source_file.endswith("/hub1/upstream/p03/bad.jsonl.gz") for r in quarantine)
    bronze = {r.edge_message_id: r for r in spark.read.parquet(str(tmp_path / "lake" / "bronze")).collect()}
    assert sorted(bronze) == ["e-000001", "e-000002", "e-000003"]
    # json.dumps with its default ", " and ": ": body_json's bytes are its text as it stands in the line.
    assert bytes(bronze["e-000001"].body) == json.dumps(body).encode()
    assert bytes(bronze["e-000002"].body) == _record(2).body
    assert bytes(bronze["e-000003"].body) == b"hi"
    assert [bronze[k].v for k in sorted(bronze)] == [2, 1, 2]
    assert all(
        bronze[k].system_properties == dict(_record(i + 1).system_properties) for i, k in enumerate(sorted(bronze))
    )
    (m,) = [m for m in _metrics(tmp_path) if m["input_rows"]]
    assert (m["input_rows"], m["bronze_rows"], m["quarantined"], m["duplicates"]) == (18, 3, 15, 0)


@pytest.mark.spark
def test_a_batch_of_bad_lines_only_is_quarantined_byte_for_byte_and_adds_nothing_to_the_other_tables(
    spark: SparkSession, tmp_path: Path
) -> None:
    # The sink stages a batch once in bronze's layout, a bad row's line carried in its body: the line must come
    # back as it was read, bytes that are not UTF-8 included.
    raw = [
        b"\xff\xfe not json \xc3\xa9",
        json.dumps({"v": 3, "edge_message_id": "bad-v", "note": "\u00e9t\u00e9"}, ensure_ascii=False).encode(),
        b'{"v": 2, "edge_message_id": "no-hub"}',
    ]
    folder = tmp_path / "landing" / "hub1" / "upstream" / "p03"
    folder.mkdir(parents=True)
    (folder / "bad.jsonl.gz").write_bytes(gzip.compress(b"\n".join(raw) + b"\n"))
    run(spark, job_settings(tmp_path))

    quarantine = spark.read.parquet(str(tmp_path / "lake" / "quarantine"))
    got = sorted(
        (r.reason, bytes(r.raw), r.edge_message_id)
        for r in quarantine.selectExpr("reason", "cast(line as binary) as raw", "edge_message_id").collect()
    )
    missing = "missing_fields:hub_id,enqueued_at,priority,ttl_s,source"
    assert got == sorted(
        [("unparseable_line", raw[0], None), ("unsupported_version", raw[1], "bad-v"), (missing, raw[2], "no-hub")]
    )
    lake = tmp_path / "lake"
    for table in ("bronze", "silver", "device_minute"):
        assert not list(lake.glob(f"{table}/*/*.parquet")), table
    (m,) = [m for m in _metrics(tmp_path) if m["input_rows"]]
    assert (m["input_rows"], m["bronze_rows"], m["quarantined"], m["duplicates"]) == (3, 0, 3, 0)


@pytest.mark.spark
def test_a_segment_that_is_not_a_whole_gzip_stream_is_quarantined_as_unreadable_and_the_job_goes_on(
    spark: SparkSession, tmp_path: Path
) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, 0, 9)
    cut = [_record(i) for i in range(100, 400)]
    data = encode_segment(cut)
    truncated = SegmentName("hub1", "upstream", 3, 100, 399)
    zone.write(truncated, data[: len(data) // 2])  # an upload cut short: a gzip stream that stops half-way
    zone.write_path("hub1/upstream/p03/plain.jsonl.gz", b"not gzip at all\n")
    settings = job_settings(tmp_path)
    run(spark, settings)
    run(spark, settings)  # and a restart finds nothing to replay: the broken files no longer block the job

    quarantine = spark.read.parquet(str(tmp_path / "lake" / "quarantine")).collect()
    unreadable = sorted(r.source_file.rsplit("/", 1)[1] for r in quarantine if r.reason == "unreadable_file")
    assert unreadable == sorted([truncated.path.rsplit("/", 1)[1], "plain.jsonl.gz"])
    # The lines before the break are read; the line cut by it is quarantined as such.
    assert all(
        r.reason == "unparseable_line" and r.source_file.endswith(truncated.path)
        for r in quarantine
        if r.reason != "unreadable_file"
    )
    assert len(quarantine) <= 3
    ids = _bronze_ids(spark, tmp_path)
    assert ids[:10] == [f"e-{i:06d}" for i in range(10)]
    assert ids[10:] == [r.edge_message_id for r in cut[: len(ids) - 10]]
    (m,) = [m for m in _metrics(tmp_path) if m["input_rows"]]
    assert m["unreadable_files"] == 2
    assert m["quarantined"] == len(quarantine)
    assert m["duplicates"] == 0


@pytest.mark.spark
def test_unreadable_files_are_found_in_compacted_source_logs_too(spark: SparkSession, tmp_path: Path) -> None:
    # The file source compacts its log every N batches ({id}.compact); with N = 2 and one file per batch, half
    # of the batches find their files there.
    zone = LandingZone(str(tmp_path / "landing"))
    for k in range(4):
        zone.write_path(f"hub1/upstream/p03/broken-{k}.jsonl.gz", f"not gzip {k}\n".encode())
    key = "spark.sql.streaming.fileSource.log.compactInterval"
    spark.conf.set(key, "2")
    try:
        run(spark, job_settings(tmp_path, max_files_per_trigger=1))
    finally:
        spark.conf.unset(key)
    assert sorted((tmp_path / "checkpoint" / "sources" / "0").glob("*.compact"))
    quarantine = spark.read.parquet(str(tmp_path / "lake" / "quarantine")).collect()
    assert sorted((r.reason, r.source_file.rsplit("/", 1)[1]) for r in quarantine) == [
        ("unreadable_file", f"broken-{k}.jsonl.gz") for k in range(4)
    ]


@pytest.mark.spark
def test_a_job_stopped_mid_stream_resumes_from_its_checkpoint_with_nothing_twice_and_nothing_missing(
    spark: SparkSession, tmp_path: Path
) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    for k in range(6):
        _land(zone, k * 10, k * 10 + 9)
    settings = job_settings(tmp_path, max_files_per_trigger=1)
    # A continuous run whose second trigger is decades away: it takes one file, then waits with five left. Where
    # it stops does not depend on timing.
    query, state = start(spark, replace(settings, trigger="continuous", processing_interval="36500 days"))
    try:
        assert state.wait_for_progress(1, timeout_s=60)
    finally:
        query.stop()
        finish(spark, query, state)
    assert len(_bronze_ids(spark, tmp_path)) == 10
    assert sorted(state.counts) == [0]

    _land(zone, 60, 69)
    run(spark, settings)
    assert _bronze_ids(spark, tmp_path) == [f"e-{i:06d}" for i in range(70)]
    run(spark, settings)  # nothing new: nothing written
    assert _bronze_ids(spark, tmp_path) == [f"e-{i:06d}" for i in range(70)]
    assert not any(m["replay_skipped"] for m in _metrics(tmp_path))  # the stop left nothing half-done


@pytest.mark.spark
def test_a_batch_in_the_lake_but_not_in_the_checkpoints_commit_log_is_skipped_on_replay(
    spark: SparkSession, tmp_path: Path
) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, 0, 9)
    settings = job_settings(tmp_path)
    run(spark, settings)
    # A crash after the sink wrote batch 0's marker but before Spark recorded the batch in its commit log (so
    # before it planned the next one): offsets/0 is there, commits/0 is not. Spark replays its last planned batch,
    # so the next run replays batch 0, finds the marker and must not write the rows again.
    forget_batches(tmp_path / "checkpoint", commits_from=0, offsets_from=1)
    assert (tmp_path / "lake" / "_committed" / "b0000000000").exists()
    run(spark, settings)
    assert _bronze_ids(spark, tmp_path) == [f"e-{i:06d}" for i in range(10)]
    assert spark.read.parquet(str(tmp_path / "lake" / "silver")).count() == 10
    replayed = [m for m in _metrics(tmp_path) if m["replay_skipped"]]
    # Only batch 0 ran: the job runs no micro-batch without new data (spark_upload.settings).
    assert [(m["batch_id"], m["input_rows"], m["bronze_rows"]) for m in replayed] == [(0, 10, 0)]

    # The skipped replay still committed batch 0's dedup state: the same ids sent again are duplicates.
    _land(zone, 0, 9, lane="upstream-p1")
    _land(zone, 10, 14)
    run(spark, settings)
    assert _bronze_ids(spark, tmp_path) == [f"e-{i:06d}" for i in range(15)]


@pytest.mark.spark
def test_a_new_checkpoint_on_a_lake_with_committed_batches_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, 0, 9)
    run(spark, job_settings(tmp_path))
    _land(zone, 10, 19)
    fresh = replace(job_settings(tmp_path), checkpoint=str(tmp_path / "another-checkpoint"))
    with pytest.raises(CheckpointMismatchError, match="is new") as refused:
        run(spark, fresh)
    assert refused.value.checkpoint.endswith("/another-checkpoint")
    assert not (tmp_path / "another-checkpoint").exists()
    assert _bronze_ids(spark, tmp_path) == [f"e-{i:06d}" for i in range(10)]


@pytest.mark.spark
def test_a_checkpoint_that_wrote_another_lake_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, 0, 9)
    first = job_settings(tmp_path)
    run(spark, first)
    other = replace(first, lake=str(tmp_path / "other-lake"), checkpoint=str(tmp_path / "other-checkpoint"))
    run(spark, other)
    with pytest.raises(CheckpointMismatchError, match="was written by query"):
        run(spark, replace(first, checkpoint=other.checkpoint))
    assert _bronze_ids(spark, tmp_path) == [f"e-{i:06d}" for i in range(10)]


@pytest.mark.spark
def test_a_batch_replayed_after_a_crash_before_its_commit_is_written_once(spark: SparkSession, tmp_path: Path) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    _land(zone, 0, 9)
    settings = job_settings(tmp_path)
    run(spark, settings)
    # A crash after the sink moved its files in but before Spark and the sink recorded the batch: the next run
    # must replay batch 0 and replace, not add to, what it had moved in.
    (tmp_path / "lake" / "_committed" / "b0000000000").unlink()
    forget_batches(tmp_path / "checkpoint", commits_from=0, offsets_from=1)
    run(spark, settings)
    assert _bronze_ids(spark, tmp_path) == [f"e-{i:06d}" for i in range(10)]
    silver = spark.read.parquet(str(tmp_path / "lake" / "silver"))
    assert silver.count() == 10


@pytest.mark.spark
def test_silver_holds_json_bodies_as_variant_and_the_example_aggregate_sums_up(
    spark: SparkSession, tmp_path: Path
) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    records = [
        _record(0, second=1, body=b'{"temp": 20, "hum": 0.5, "label": "a"}'),
        _record(1, second=30, body=b'{"temp": 24.5, "label": "b"}'),
        _record(2, second=61, body=b'{"temp": 30}'),
        _record(3, second=62, body=b"\x00\x01 not json"),
        # JSON that is not an object: legal bodies, in bronze and silver, with no fields to aggregate.
        _record(4, second=121, body=b"[1, 2]"),
        _record(5, second=122, body=b"42"),
        _record(6, second=123, body=b'"x"'),
    ]
    zone.write(SegmentName("hub1", "upstream", 3, 0, 6), encode_segment(records))
    run(spark, job_settings(tmp_path))

    assert _bronze_ids(spark, tmp_path) == [f"e-{i:06d}" for i in range(7)]
    silver = spark.read.parquet(str(tmp_path / "lake" / "silver"))
    assert dict(silver.dtypes)["body"] == "variant"
    temps = silver.selectExpr(
        "edge_message_id", "variant_get(body, '$.temp', 'double') AS temp", "to_json(body) AS json"
    ).collect()
    assert sorted((r.edge_message_id, r.temp, r.json) for r in temps) == [
        ("e-000000", 20.0, '{"hum":0.5,"label":"a","temp":20}'),
        ("e-000001", 24.5, '{"label":"b","temp":24.5}'),
        ("e-000002", 30.0, '{"temp":30}'),
        ("e-000003", None, None),
        ("e-000004", None, "[1,2]"),
        ("e-000005", None, "42"),
        ("e-000006", None, '"x"'),
    ]
    stats = [r.asDict() for r in device_minute_stats(spark, str(tmp_path / "lake")).collect()]
    minute0 = [s for s in stats if s["minute"].timestamp() == BASE_S]
    assert {(s["field"], s["count"], s["n"], s["min"], s["max"], s["avg"]) for s in minute0} == {
        ("hum", 2, 1, 0.5, 0.5, 0.5),
        ("temp", 2, 2, 20.0, 24.5, 22.25),
    }
    minute1 = [s for s in stats if s["minute"].timestamp() == BASE_S + 60]
    assert {(s["field"], s["count"], s["n"], s["min"], s["max"]) for s in minute1} == {("temp", 2, 1, 30.0, 30.0)}
    minute2 = [s for s in stats if s["minute"].timestamp() == BASE_S + 120]
    assert [(s["field"], s["count"], s["n"]) for s in minute2] == [(None, 3, None)]  # counted, no fields


@pytest.mark.spark
def test_metrics_reach_a_lake_that_only_hadoop_can_open(spark: SparkSession, tmp_path: Path) -> None:
    # A viewfs:// mount of a local folder: a lake URL Python cannot open, as s3a:// or abfss:// would be, while
    # the test can still look at the files.
    mount = f"lake{abs(hash(tmp_path))}"
    key = f"fs.viewfs.mounttable.{mount}.link./lake"
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop_conf.set(key, (tmp_path / "lake").as_uri())
    try:
        zone = LandingZone(str(tmp_path / "landing"))
        _land(zone, 0, 9)
        run(spark, replace(job_settings(tmp_path), lake=f"viewfs://{mount}/lake"))
    finally:
        hadoop_conf.unset(key)
    assert _bronze_ids(spark, tmp_path) == [f"e-{i:06d}" for i in range(10)]
    (m,) = [m for m in _metrics(tmp_path) if m["input_rows"]]
    assert (m["batch_id"], m["input_rows"], m["bronze_rows"]) == (0, 10, 10)


@pytest.mark.spark
def test_files_are_capped_and_compaction_merges_old_partitions_without_losing_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    zone = LandingZone(str(tmp_path / "landing"))
    settings = job_settings(tmp_path, max_records_per_file=4)
    for k in range(3):
        _land(zone, k * 10, k * 10 + 9)
        run(spark, settings)
    bronze = tmp_path / "lake" / "bronze"
    (partition,) = list(bronze.iterdir())
    before = sorted(partition.glob("part-*.parquet"))
    assert len(before) >= 3 * 3  # 10 rows per batch at 4 per file

    tomorrow = (date.today() + timedelta(days=2)).isoformat()
    done = compact(spark, str(tmp_path / "lake"), before=tomorrow, max_records_per_file=16)
    after = sorted(partition.glob("part-*.parquet"))
    assert done[f"bronze/{partition.name}"] == len(after) == 2
    assert _bronze_ids(spark, tmp_path) == [f"e-{i:06d}" for i in range(30)]
    rows = spark.read.parquet(str(bronze)).where("edge_message_id = 'e-000007'").collect()
    assert [bytes(r.body) for r in rows] == [_record(7).body]
