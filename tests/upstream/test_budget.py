"""The budget ledger: periods in UTC, a day and a month counted side by side, counts kept in a file across restarts
(the version 1 file of before read too), the marks logged once a period and naming it, and a torn file counted
from zero rather than a failed start."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from edgehub.testing.clock import ManualClock
from edgehub.upstream.budget import (
    Budget,
    BudgetLedger,
    BudgetMark,
    LedgerFileError,
    Period,
    check_budgets,
    describe_budgets,
    period_end,
    period_start,
    read_ledger_file,
    wire_bytes,
)


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


@pytest.mark.parametrize(
    ("now", "period", "hour", "end"),
    [
        ("2026-12-07 16:30", Period.DAY, 0, "2026-12-08 00:00"),
        ("2026-12-07 05:59", Period.DAY, 6, "2026-12-07 06:00"),
        ("2026-12-07 16:30", Period.MONTH, 0, "2027-01-01 00:00"),
        ("2026-12-01 02:00", Period.MONTH, 3, "2026-12-01 03:00"),
        ("2027-01-31 23:00", Period.MONTH, 0, "2027-02-01 00:00"),
    ],
)
def test_a_period_ends_where_the_next_begins(now: str, period: Period, hour: int, end: str) -> None:
    assert iso(period_end(at(now), period, hour)) == end


def test_wire_bytes_add_the_estimated_tcp_ip_and_tls_overhead() -> None:
    assert wire_bytes(0, tls=False) == 0
    assert wire_bytes(100, tls=False) == 152  # one segment
    assert wire_bytes(1448 * 2, tls=False) == 1448 * 2 + 2 * 52
    assert wire_bytes(100, tls=True) == 129 + 52  # one TLS record, one segment


def ledger(path: Path | None, clock: ManualClock, limit: int = 1000) -> BudgetLedger:
    return BudgetLedger(path, {"sat": ((Budget(limit, Period.DAY, 6),), 8.0), "cell": ((), 0.0)}, clock=clock)


def both(path: Path | None, clock: ManualClock, day: int = 1_000, month: int = 10_000) -> BudgetLedger:
    """A satellite plan: ``month`` bytes a month from the 1st at 03:00, never more than ``day`` a day from 06:00."""
    budgets = (Budget(month, Period.MONTH, 3), Budget(day, Period.DAY, 6))
    return BudgetLedger(path, {"sat": (budgets, 8.0)}, clock=clock)


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
    assert again.count("sat").cost == pytest.approx(300 / 2**20 * 8.0)
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
    assert first.count("sat").mark is BudgetMark.SPENT
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
    (day,) = json.loads((tmp_path / "budget.json").read_text())["links"]["sat"]["periods"]
    assert (day["period"], day["startHourUtc"], day["bytes"], day["budgetBytes"]) == ("day", 6, 1010, 10**9)


@pytest.mark.parametrize(
    "content",
    [
        "{",
        '{"version": 99, "links": {}}',
        '{"version": 1, "links": {"sat": 5}}',
        '{"version": 2, "links": {"sat": {"costPerMiB": 8, "periods": []}}}',
        '{"version": 2, "links": {"sat": {"costPerMiB": 8, "periods": [{"period": "week"}]}}}',
        '{"version": 2, "links": {"sat": {"costPerMiB": -1, "periods": [{"period": "day", "startHourUtc": 6, '
        '"periodStart": 0, "bytes": 1, "mark": "under"}]}}}',
        "[]",
        " " * (64 * 1024) + "{}",
        *(
            '{"version": 2, "links": {"sat": {"costPerMiB": 8, "periods": [{"period": "day", "startHourUtc": 6, '
            f'"periodStart": {start}, "bytes": {nbytes}, "mark": "under", "budgetBytes": 1000}}]}}}}}}'
            for start, nbytes in (("1e300", "1"), ("-1e15", "1"), ("1796601600", "Infinity"), ("1796601600", "1.5"))
        ),
        '{"version": 2, "links": {"' + "x" * 5000 + '": {"costPerMiB": "' + "y" * 5000 + '", "periods": []}}}',
        '{"version": 1, "links": {"sat\\nlink fake: 0 B": {"periodStart": 1796601600, "bytes": 1, "mark": "under"}}}',
    ],
    ids=[
        "torn",
        "other-version",
        "bad-entry",
        "no-period",
        "bad-period",
        "negative-cost",
        "not-an-object",
        "too-large",
        "start-past-any-date",
        "start-before-1970",
        "infinite-bytes",
        "fractional-bytes",
        "long-name-and-value",
        "name-of-two-lines",
    ],
)
def test_an_unreadable_file_is_logged_and_counted_from_zero(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "budget.json"
    path.write_text(content)
    book = ledger(path, ManualClock(at("2026-12-07 12:00")))
    assert book.used_bytes("sat") == 0
    (logged,) = [r.getMessage() for r in caplog.records if "link.budget_unreadable" in r.getMessage()]
    assert len(logged) < 400  # one short line, whatever the file holds
    with pytest.raises(LedgerFileError):
        read_ledger_file(path)


def test_a_budget_is_checked_when_made() -> None:
    with pytest.raises(ValueError, match="positive"):
        Budget(0, Period.DAY)
    with pytest.raises(ValueError, match="0-23"):
        Budget(1, Period.MONTH, 24)
    with pytest.raises(ValueError, match="at most one budget per period"):
        check_budgets([Budget(1, Period.DAY), Budget(2, Period.DAY, 6)])
    assert check_budgets([Budget(2, Period.MONTH), Budget(1, Period.DAY)]) == (
        Budget(1, Period.DAY),
        Budget(2, Period.MONTH),
    )
    assert describe_budgets(check_budgets([Budget(2, Period.MONTH), Budget(1, Period.DAY, 6)])) == (
        "1 B/day from 06:00 UTC + 2 B/month"
    )


# -- a day and a month on one link --------------------------------------------------------------------------------


def test_a_day_and_a_month_are_counted_side_by_side_and_the_link_is_spent_by_either(tmp_path: Path) -> None:
    clock = ManualClock(at("2026-12-07 12:00"))
    book = both(tmp_path / "budget.json", clock, day=1_000, month=2_500)
    book.add("sat", 900)
    day, month = book.counts("sat")
    assert (day.period, day.bytes, day.left_bytes) == (Period.DAY, 900, 100)
    assert (month.period, month.bytes, month.left_bytes) == (Period.MONTH, 900, 1_600)
    assert iso(day.period_start_s) == "2026-12-07 06:00"
    assert iso(month.period_start_s) == "2026-12-01 03:00"
    assert iso(month.period_end_s) == "2027-01-01 03:00"
    assert book.count("sat").period is Period.DAY  # the budget with the fewest bytes left binds
    assert not book.spent("sat")
    book.add("sat", 100)
    assert book.spent("sat")  # the day's budget is spent, the month's is not
    assert book.count("sat", Period.MONTH).left_bytes == 1_500
    clock.advance(86_400)  # the next day: the day's budget is whole again, the month's count goes on
    assert not book.spent("sat")
    book.add("sat", 900)
    clock.advance(86_400)
    book.add("sat", 700)  # the month: 1000 + 900 + 700 = 2600 of 2500
    assert book.count("sat", Period.DAY).bytes == 700
    assert book.count("sat").period is Period.MONTH
    assert book.spent("sat")  # by the month's budget, with the day's far from spent
    with pytest.raises(KeyError):
        ledger(None, clock).count("cell", Period.MONTH)


def test_a_restart_across_a_day_boundary_inside_a_month_resets_the_day_and_keeps_the_month(tmp_path: Path) -> None:
    path = tmp_path / "links" / "budget.json"
    first = both(path, ManualClock(at("2026-12-07 12:00")))
    first.add("sat", 400)
    first.flush()  # the hub stops at noon ...
    again = both(path, ManualClock(at("2026-12-08 07:00")))  # ... and starts after the day began at 06:00
    assert again.count("sat", Period.DAY).bytes == 0
    assert again.count("sat", Period.MONTH).bytes == 400
    again.add("sat", 50)
    again.flush()
    later_that_day = both(path, ManualClock(at("2026-12-08 09:30")))
    assert (later_that_day.count("sat", Period.DAY).bytes, later_that_day.count("sat", Period.MONTH).bytes) == (
        50,
        450,
    )
    next_month = both(path, ManualClock(at("2027-01-01 03:00")))  # both periods began since: nothing counted
    assert [c.bytes for c in next_month.counts("sat")] == [0, 0]


def test_each_budgets_marks_are_logged_once_a_period_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edgehub.upstream.budget")
    clock = ManualClock(at("2026-12-07 12:00"))
    path = tmp_path / "budget.json"
    book = both(path, clock, day=1_000, month=2_000)
    for _ in range(10):
        book.add("sat", 100)  # the day: 80 %, 100 %; the month: 50 %

    def marks() -> list[tuple[str, str]]:
        out = []
        for r in caplog.records:
            words = r.getMessage().split()
            if words[0].startswith("link.budget_"):
                out.append((words[0], next(w for w in words if w.startswith("period="))))
        return out

    assert marks() == [("link.budget_80", "period=day"), ("link.budget_100", "period=day")]
    both(path, clock, day=1_000, month=2_000).add("sat", 1)  # a restart: the marks reached are kept
    assert len(marks()) == 2
    clock.advance(86_400)
    for _ in range(6):
        book.add("sat", 100)  # the month: 1,600 of 2,000
    assert marks()[2:] == [("link.budget_80", "period=month")]


def test_a_version_1_file_is_read_into_each_period_that_began_when_its_count_did(tmp_path: Path) -> None:
    """A hub upgraded in the middle of a month keeps the month's bytes: the old file's one count is the month's
    when the old budget was the month's (same start), and a day budget added now starts from zero."""
    path = tmp_path / "budget.json"
    month_start = at("2026-12-01 03:00")
    path.write_text(
        json.dumps({"version": 1, "links": {"sat": {"periodStart": month_start, "bytes": 4_000, "mark": "under"}}})
    )
    book = both(path, ManualClock(at("2026-12-07 12:00")), day=1_000, month=10_000)
    assert book.count("sat", Period.MONTH).bytes == 4_000
    assert book.count("sat", Period.DAY).bytes == 0
    book.flush()
    assert read_ledger_file(path).version == 2
    assert both(path, ManualClock(at("2026-12-07 12:00"))).count("sat", Period.MONTH).bytes == 4_000


def test_the_file_read_alone_holds_each_links_periods_cost_and_budgets(tmp_path: Path) -> None:
    path = tmp_path / "budget.json"
    book = both(path, ManualClock(at("2026-12-07 12:00")))
    book.add("sat", 640)
    book.flush()
    saved = read_ledger_file(path)
    assert saved.cost_per_mib == {"sat": 8.0}
    assert [(c.period, c.start_hour_utc, c.bytes, c.budget_bytes) for c in saved.links["sat"]] == [
        (Period.DAY, 6, 640, 1_000),
        (Period.MONTH, 3, 640, 10_000),
    ]
    with pytest.raises(LedgerFileError, match="no such file"):
        read_ledger_file(tmp_path / "missing.json")
