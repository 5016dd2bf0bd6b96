"""The budget ledger: periods in UTC, counts kept in a file across restarts, the marks logged once a period, and a
torn file counted from zero rather than a failed start."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from edgehub.testing.clock import ManualClock
from edgehub.upstream.budget import Budget, BudgetLedger, BudgetMark, Period, period_start, wire_bytes


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


@pytest.mark.parametrize(
    ("now", "period", "hour", "start"),
    [
        ("2026-12-07 16:30", Period.DAY, 0, "2026-12-07 00:00"),
        ("2026-12-07 05:59", Period.DAY, 6, "2026-12-06 06:00"),
        ("2026-12-07 06:00", Period.DAY, 6, "2026-12-07 06:00"),
        ("2026-12-07 16:30", Period.MONTH, 0, "2026-12-01 00:00"),
        ("2026-12-01 02:00", Period.MONTH, 3, "2026-11-01 03:00"),
        ("2027-01-01 02:59", Period.MONTH, 3, "2026-12-01 03:00"),
    ],
)
def test_a_period_starts_at_its_hour_in_utc(now: str, period: Period, hour: int, start: str) -> None:
    assert iso(period_start(at(now), period, hour)) == start


def test_wire_bytes_add_the_estimated_tcp_ip_and_tls_overhead() -> None:
    assert wire_bytes(0, tls=False) == 0
    assert wire_bytes(100, tls=False) == 152  # one segment
    assert wire_bytes(1448 * 2, tls=False) == 1448 * 2 + 2 * 52
    assert wire_bytes(100, tls=True) == 129 + 52  # one TLS record, one segment


def ledger(path: Path | None, clock: ManualClock, limit: int = 1000) -> BudgetLedger:
    return BudgetLedger(path, {"sat": (Budget(limit, Period.DAY, 6), 8.0), "cell": (None, 0.0)}, clock=clock)


def test_a_restart_remembers_the_periods_bytes_and_a_new_period_starts_from_zero(tmp_path: Path) -> None:
    clock = ManualClock(at("2026-12-07 12:00"))
    path = tmp_path / "links" / "budget.json"
    first = ledger(path, clock)
    first.add("sat", 300)
    first.add("cell", 5 * 2**20)
    first.flush()
    again = ledger(path, clock)  # the hub restarted at noon
    assert again.used_bytes("sat") == 300
    assert again.left_bytes("sat") == 700
    assert again.cost("sat") == pytest.approx(300 / 2**20 * 8.0)
    assert again.used_bytes("cell") == 5 * 2**20
    assert again.left_bytes("cell") is None
    clock.advance(18 * 3600)  # 06:00 the next day: sat's period begins; cell's (midnight) began at 00:00
    assert again.used_bytes("sat") == 0
    assert again.used_bytes("cell") == 0
    assert ledger(path, ManualClock(at("2026-12-08 05:59"))).used_bytes("sat") == 300  # the old file: same period


def test_a_file_of_an_earlier_period_is_not_counted_in_this_one(tmp_path: Path) -> None:
    clock = ManualClock(at("2026-12-07 12:00"))
    path = tmp_path / "budget.json"
    first = ledger(path, clock)
    first.add("sat", 999)
    first.flush()
    clock.advance(86_400)  # the hub was down across the period's start
    assert ledger(path, clock).used_bytes("sat") == 0


def test_the_marks_are_logged_once_a_period_and_kept_over_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edgehub.upstream.budget")
    clock = ManualClock(at("2026-12-07 12:00"))
    path = tmp_path / "budget.json"
    first = ledger(path, clock)
    for _ in range(12):
        first.add("sat", 100)
    assert first.spent("sat")
    assert first.usage("sat").mark is BudgetMark.SPENT
    again = ledger(path, clock)  # written at once when the mark was crossed
    again.add("sat", 100)
    marks = [r.getMessage().split()[0] for r in caplog.records if r.getMessage().startswith("link.budget_")]
    assert marks == ["link.budget_80", "link.budget_100"]
    clock.advance(86_400)
    again.add("sat", 850)
    marks = [r.getMessage().split()[0] for r in caplog.records if r.getMessage().startswith("link.budget_")]
    assert marks == ["link.budget_80", "link.budget_100", "link.budget_80"]  # a new period logs again


def test_writes_come_at_most_once_a_second_while_bytes_come(tmp_path: Path) -> None:
    clock = ManualClock(at("2026-12-07 12:00"))
    book = ledger(tmp_path / "budget.json", clock, limit=10**9)
    for _ in range(100):
        book.add("sat", 10)
    assert book.writes == 0
    assert book.flush_due() is False
    clock.advance(1.0)
    book.add("sat", 10)
    assert book.writes == 1
    assert json.loads((tmp_path / "budget.json").read_text())["links"]["sat"]["bytes"] == 1010


@pytest.mark.parametrize(
    "content",
    ["{", '{"version": 99, "links": {}}', '{"version": 1, "links": {"sat": 5}}', " " * (64 * 1024) + "{}"],
    ids=["torn", "other-version", "bad-entry", "too-large"],
)
def test_an_unreadable_file_is_logged_and_counted_from_zero(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "budget.json"
    path.write_text(content)
    book = ledger(path, ManualClock(at("2026-12-07 12:00")))
    assert book.used_bytes("sat") == 0
    assert any("link.budget_unreadable" in r.getMessage() for r in caplog.records)


def test_a_budget_is_checked_when_made() -> None:
    with pytest.raises(ValueError, match="positive"):
        Budget(0, Period.DAY)
    with pytest.raises(ValueError, match="0-23"):
        Budget(1, Period.MONTH, 24)
