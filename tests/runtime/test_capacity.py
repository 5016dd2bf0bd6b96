"""``edgehub capacity``: the arithmetic case by case, the stated store overhead against a real RocksDB store, and
the command line's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgehub.runtime.capacity import MEASURED_OVERHEAD, measure_overhead, overhead_bytes, plan
from edgehub.runtime.cli import main
from edgehub.runtime.cli.capacity import parse_message_rate

# message, rate/s, ttl s, store B, uplink bit/s, overhead, wire -> fits, full after s, survives s, use, drain s
CASES = [
    pytest.param(1000, 10, 3600, 100_000_000, 64_000, 170, 1100, 85_470, None, 3600, 1.375, None, id="ttl-first"),
    pytest.param(1000, 10, 86_400, 10_000_000, 256_000, 170, 1000, 8547, 854.7, 854.7, 0.3125, 388.5, id="fills"),
    pytest.param(100, 10, 600, None, 8000, 0, 100, None, None, None, 1.0, None, id="uplink-exactly-full"),
    pytest.param(200, 0.5, 600, None, None, 160, 250, None, None, None, None, None, id="nothing-given"),
]


@pytest.mark.parametrize(
    ("message", "rate", "ttl", "store", "uplink", "overhead", "wire", "fits", "full", "survives", "use", "drain"),
    CASES,
)
def test_plan_works_out_what_fits_what_it_survives_and_the_catch_up(
    message: int,
    rate: float,
    ttl: float,
    store: int | None,
    uplink: float | None,
    overhead: int,
    wire: int,
    fits: int | None,
    full: float | None,
    survives: float | None,
    use: float | None,
    drain: float | None,
) -> None:
    p = plan(
        message_bytes=message,
        rate_per_s=rate,
        ttl_s=ttl,
        store_bytes=store,
        uplink_bps=uplink,
        overhead=overhead,
        wire=wire,
    )
    assert p.stored_bytes == message + overhead
    assert p.ttl_messages == int(rate * ttl)
    assert p.ttl_store_bytes == int(rate * ttl) * (message + overhead)
    assert p.needed_bps == rate * wire * 8
    assert p.fits_messages == fits
    assert p.full_after_s == pytest.approx(full)
    assert p.survives_s == pytest.approx(survives)
    assert p.uplink_use == pytest.approx(use)
    assert p.drain_s == (None if drain is None else pytest.approx(drain, rel=1e-3))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"message_bytes": 0}, "message size"),
        ({"rate_per_s": 0.0}, "rate"),
        ({"ttl_s": -1.0}, "ttl"),
        ({"store_bytes": 0}, "store size"),
        ({"uplink_bps": 0.0}, "uplink"),
    ],
)
def test_plan_refuses_a_quantity_that_is_not_positive(kwargs: dict[str, float], named: str) -> None:
    args: dict[str, float] = {"message_bytes": 100, "rate_per_s": 1.0, "ttl_s": 60.0, **kwargs}
    with pytest.raises(ValueError, match=named):
        plan(overhead=10, wire=100, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("size", "overhead"), [(100, 160), (512, 160), (768, 163), (2048, 174), (4096, 189), (65_536, 189)]
)
def test_the_overhead_is_the_measured_table_interpolated_and_flat_outside_it(size: int, overhead: int) -> None:
    assert overhead_bytes(size) == overhead


@pytest.mark.parametrize(("text", "per_s"), [("10/s", 10.0), ("600/min", 10.0), ("36000/h", 10.0), ("2.5", 2.5)])
def test_message_rates_read_per_second_minute_or_hour(text: str, per_s: float) -> None:
    assert parse_message_rate(text) == per_s


@pytest.mark.parametrize("size", [size for size, _ in MEASURED_OVERHEAD])
def test_the_stated_overhead_matches_a_real_rocksdb_store_within_a_fifth(tmp_path: Path, size: int) -> None:
    m = measure_overhead(size, messages=5000, folder=tmp_path)
    assert m.charged_bytes == size
    assert m.overhead_bytes == pytest.approx(overhead_bytes(size), rel=0.2)


def test_capacity_prints_json_for_scripts_and_refuses_bad_flags_by_name() -> None:
    args = ["capacity", "--message-bytes", "1000", "--rate", "10/s", "--ttl", "1h", "--store-bytes", "100MB"]
    result = CliRunner().invoke(main, [*args, "--uplink", "64kbit", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["fits_messages"] == 100_000_000 // (1000 + overhead_bytes(1000))
    assert doc["survives_s"] == 3600
    text = CliRunner().invoke(main, args).output
    assert "it never fills; an outage up to the TTL (1.0 h) loses nothing" in text
    for flag, value in (("--rate", "fast"), ("--ttl", "none"), ("--store-bytes", "auto"), ("--uplink", "quick")):
        result = CliRunner().invoke(main, [*args, flag, value])
        assert result.exit_code == 2, result.output
        assert f"Invalid value for {flag}" in result.output
        assert "Traceback" not in result.output
