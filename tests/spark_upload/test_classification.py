"""The classification's fast paths, each held to the general rule it stands in for (spark_upload.classification).

``enqueued_at`` casts text of the hub's exact shape instead of parsing it with the strict pattern,
``system_properties`` builds the map from plain expressions when the record's system properties are all column
ones, and ``_body_json_text`` cuts body_json's text with a regular expression instead of ``locate`` and ``substr``.
Each must give what the general path gives, on the inputs that take it and on those that do not.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_upload.classification import (
    _ENQUEUED_AT_FORMAT,
    _PARSE_SCHEMA,
    _body_json_cut,
    _body_json_text,
    _system_properties_general,
    enqueued_at,
    system_properties,
)

# Text of the hub's shape (the fast path) with every kind of wrong value, and text of other shapes (the pattern).
_TIMES = [
    "2026-11-22T21:19:30.500Z",
    "1970-01-01T00:00:00.000Z",
    "0001-01-01T00:00:00.000Z",
    "9999-12-31T23:59:59.999Z",
    "2024-02-29T12:00:00.000Z",  # a leap day
    "2026-02-29T12:00:00.000Z",  # not one
    "2026-02-30T00:00:00.000Z",
    "2026-04-31T00:00:00.000Z",
    "2026-13-01T00:00:00.000Z",
    "2026-00-10T00:00:00.000Z",
    "2026-11-00T00:00:00.000Z",
    "2026-11-22T24:00:00.000Z",
    "2026-11-22T23:60:00.000Z",
    "2026-11-22T23:59:60.000Z",  # a leap second
    "0000-01-01T00:00:00.000Z",
    "2026-11-22T21:19:30.50Z",
    "2026-11-22T21:19:30.5000Z",
    "2026-11-22T21:19:30Z",
    "2026-11-22 21:19:30.500Z",
    "2026-11-22T21:19:30.500+01:00",
    "2026-11-22T21:19:30.500+01",
    "2026-11-22T21:19:30.500",
    "2026-11-22T1:19:30.500Z",
    "2026-11-22T1:19:30.5000Z",  # the hub's length, with a T and a Z where it has them
    "2026-1-22T21:19:30.500Z",
    "2026-11-22T21:19:30.500z",
    " 2026-11-22T21:19:30.500Z",
    "2026-11-22T21:19:30.500Z ",
    "+2026-11-22T21:19:30.500Z",
    "yesterday",
    "",
]


@pytest.mark.spark
def test_enqueued_at_gives_what_the_strict_pattern_gives(spark: SparkSession) -> None:
    times = spark.createDataFrame([(t,) for t in _TIMES], "t string")
    rows = times.select(
        "t",
        # as microseconds: Python's datetime has no year 0, which both paths may give
        F.unix_micros(enqueued_at(F.col("t"))).alias("fast"),
        F.unix_micros(F.try_to_timestamp(F.col("t"), F.lit(_ENQUEUED_AT_FORMAT))).alias("strict"),
    ).collect()
    assert [(r.t, r.fast) for r in rows] == [(r.t, r.strict) for r in rows]
    # Both paths are taken, and the pattern accepts the hub's own text.
    assert sum(r.strict is not None for r in rows) >= 5
    assert rows[0].strict == round(datetime(2026, 11, 22, 21, 19, 30, 500_000, tzinfo=UTC).timestamp() * 1_000_000)


def _record(system_properties: object, **columns: object) -> str:
    base: dict[str, object] = {
        "v": 2,
        "edge_message_id": "e1",
        "message_id": "m1",
        "device_id": "dev1",
        "module_id": "mod1",
    }
    obj = {**base, **columns}
    if system_properties != "absent":
        obj["system_properties"] = system_properties
    return json.dumps(obj)


_SYSTEM_PROPERTIES = [
    _record({"edgeMessageId": None, "messageId": None}),  # what the hub writes for most messages
    _record({}),
    _record("absent"),
    _record(None),
    _record({"connectionDeviceId": "other", "messageId": None}),
    _record({"connectionDeviceId": None, "connectionModuleId": "m2"}),
    _record({"edgeMessageId": None}, module_id=None, message_id=None),
    _record({"messageId": "zz"}, message_id=None),
    _record({"edgeMessageId": None, "messageId": None, "connectionDeviceId": None, "connectionModuleId": None}),
    _record({"contentType": "application/json", "messageId": None}),  # another key: the general path
    _record({"contentType": None, "x": "1", "connectionDeviceId": "other"}),
    _record({"contentType": "json"}, device_id=None, module_id=None),
    _record({"a": "b", "messageId": None}, v=1),  # v1: as written
    _record({"edgeMessageId": None}, v=1),
]


@pytest.mark.spark
def test_system_properties_gives_what_the_general_rule_gives(spark: SparkSession) -> None:
    lines = spark.createDataFrame([(line,) for line in _SYSTEM_PROPERTIES], "value string")
    r = F.col("r")
    rows = (
        lines.select("value", F.from_json("value", _PARSE_SCHEMA).alias("r"))
        .select(
            "value",
            system_properties(r).alias("fast"),
            F.when(r["v"] == 1, r["system_properties"]).otherwise(_system_properties_general(r)).alias("general"),
        )
        .collect()
    )
    assert [(row.value, row.fast) for row in rows] == [(row.value, row.general) for row in rows]
    # The rule itself, on the hub's usual record: the column properties the record left out are back, the ones
    # it wrote as null are not.
    assert rows[0].fast == {"connectionDeviceId": "dev1", "connectionModuleId": "mod1"}
    assert rows[2].fast == {
        "edgeMessageId": "e1",
        "messageId": "m1",
        "connectionDeviceId": "dev1",
        "connectionModuleId": "mod1",
    }


# Lines with body_json's key where the hub puts it, elsewhere, twice, or not written as the rule looks for it; the
# characters around it of every kind the two paths could count differently (multi-byte, outside the BMP, line breaks
# and the other line terminators a regular expression's $ would stop before).
_BODY_JSON_LINES = [
    '{"v":2,"hub_id":"h","body_json":{"temp":21.5,"seq":1}}',  # what the hub writes
    '{"v": 2, "body_json": {"a": 1}}',  # json.dumps' default spacing
    '{"v":2,"body_json":{"a":1}}   ',
    '   {"v":2,"body_json":[1,2]}',
    '{"v":2,"body_json":{"a":1}}\t',
    '{"v":2,"body_json":"  spaced  "  }',
    '{"v":2,"properties":{"body_json":"x"},"body_json":5}',  # the first key is not the last field's
    '{"v":2,"body_json":{"body_json":{"body_json":1}}}',
    '{"v":2,"d":"h\u00e9llo \u2713","body_json":{"t":"\U0001f600 \u00e9"}}',
    '{"v":2,"body_json":{"t":1}}\U0001f600',
    '{"v":2,"body_json":{"t":"a\nb"}}',
    '{"v":2,"body_json":{"t":1}}\n',
    '{"v":2,"body_json":{"t":1}}\r',
    '{"v":2,"body_json":{"t":1}}\u2028',
    '{"v":2,"body_json":{"t":1}}\r\n',
    '{"v":2,"body_json":1}',  # two characters after the key
    '"body_json":xy',
    '{"v":2,"body_json":}',  # one: the general path
    '{"v":2,"body_json":',
    '{"v":2,"body_json" :1}',
    '{"v":2,"body\\u005fjson":1}',
    "no key at all",
    "",
]


@pytest.mark.spark
def test_body_json_text_gives_what_locate_and_substr_give(spark: SparkSession) -> None:
    lines = spark.createDataFrame([(line,) for line in _BODY_JSON_LINES], "value string")
    value = F.col("value")
    rows = (
        lines.select("value", _body_json_cut(value).alias("cut"))
        .select(
            "value",
            "cut",
            _body_json_text(value, F.col("cut")).alias("fast"),
            _body_json_text(value, F.lit("")).alias("general"),  # an empty cut: the rule as stated
        )
        .collect()
    )
    assert [(row.value, row.fast) for row in rows] == [(row.value, row.general) for row in rows]
    took_the_fast_path = [row.value for row in rows if row.cut != ""]
    assert took_the_fast_path == _BODY_JSON_LINES[:17]
    # The rule itself: the value after the first key, up to the last character, spaces around it aside.
    assert [row.fast for row in rows[:8]] == [
        '{"temp":21.5,"seq":1}',
        '{"a": 1}',
        '{"a":1}',
        "[1,2]",
        '{"a":1}}',
        '"  spaced  "',
        '"x"},"body_json":5',
        '{"body_json":{"body_json":1}}',
    ]
    assert rows[8].fast == '{"t":"\U0001f600 \u00e9"}'
    assert rows[13].fast == '{"t":1}}'
