"""``edgehub status DATA_DIR`` of a stopped hub shows each link's bytes, cost and budget left per period from
``DATA_DIR/links/budget.json`` alone (written by a real ``BudgetLedger``, the store a real RocksDB in ``tmp_path``),
and says in one line, with no traceback, when that file is missing or cannot be read. The console script runs as a
process, as ``tests/runtime/admin/test_status.py`` runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edgehub.runtime.compose.links import BUDGET_FILE
from edgehub.runtime.compose.store import open_store
from edgehub.testing.clock import ManualClock
from edgehub.upstream.budget import MAX_FILE_BYTES, Budget, BudgetLedger, Period

pytestmark = pytest.mark.timeout(120)

EDGEHUB = str(Path(sys.executable).parent / "edgehub")
SAT_BUDGETS = (Budget(1_000_000, Period.DAY), Budget(20_000_000, Period.MONTH))


def edgehub(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EDGEHUB, *args], capture_output=True, text=True, timeout=60, check=False)


async def stopped_hub(data: Path) -> None:
    """A data directory as a hub leaves it: its store made and closed (nothing runs, no admin port)."""
    store = open_store(data)
    await store.close()


def links_of(data: Path) -> tuple[list[str], dict[str, Any]]:
    """The stopped hub's status as lines and as JSON (``link_ledger``), both runs exiting 0."""
    text = edgehub("status", "--data-dir", str(data))
    assert text.returncode == 0, text.stderr
    assert "Traceback" not in text.stderr
    as_json = edgehub("status", "--json", "--data-dir", str(data))
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["running"] is False
    return [line for line in text.stdout.splitlines() if line.startswith(("link", "links"))], doc["link_ledger"]


async def test_a_stopped_hub_shows_each_links_bytes_cost_and_budget_left_per_period(tmp_path: Path) -> None:
    data = tmp_path / "data"
    await stopped_hub(data)
    ledger = BudgetLedger(data / BUDGET_FILE, {"cell": ((), 0.01), "sat": (SAT_BUDGETS, 8.0)})
    ledger.add("cell", 3 * 2**20)
    ledger.add("sat", 300_000)
    ledger.flush()  # as the hub does when it stops

    lines, doc = links_of(data)
    links = {k["link"]: k for k in doc["links"]}
    sat_day, sat_month = links["sat"]["periods"]
    assert (sat_day["period"], sat_day["bytes"], sat_day["ended"]) == ("day", 300_000, False)
    assert sat_day["cost"] == pytest.approx(300_000 / 2**20 * 8.0, abs=1e-4)
    assert sat_day["budget_left_bytes"] == 700_000
    assert (sat_month["period"], sat_month["bytes"], sat_month["budget_left_bytes"]) == ("month", 300_000, 19_700_000)
    (cell_day,) = links["cell"]["periods"]
    assert (cell_day["bytes"], cell_day["cost"], cell_day["budget_bytes"]) == (3 * 2**20, 0.03, None)
    assert lines[0].startswith(f"link cell: {3 * 2**20} B this day from ")
    assert lines[0].endswith("(cost 0.03)")
    assert lines[1].startswith("link sat: 300000 B this day from ")
    assert lines[1].endswith(f"(cost {sat_day['cost']}), budget 700000 of 1000000 B left")
    assert lines[2].startswith("link sat: 300000 B this month from ")
    assert lines[2].endswith("budget 19700000 of 20000000 B left")


async def test_a_stopped_hub_says_when_a_day_counted_in_its_file_has_ended(tmp_path: Path) -> None:
    data = tmp_path / "data"
    await stopped_hub(data)
    two_days_ago = ManualClock(time.time() - 2 * 86_400)
    ledger = BudgetLedger(data / BUDGET_FILE, {"sat": (SAT_BUDGETS, 8.0)}, clock=two_days_ago)
    ledger.add("sat", 900_000)
    ledger.flush()
    lines, doc = links_of(data)
    day = doc["links"][0]["periods"][0]
    assert (day["period"], day["ended"], day["bytes"]) == ("day", True, 900_000)
    assert lines[0].startswith("link sat: 900000 B the day that ended (0 B since) from ")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "no such file"),
        ("{", "JSONDecodeError"),
        ('{"version": 7, "links": {}}', "version 7"),
        (" " * (MAX_FILE_BYTES + 1), f"over {MAX_FILE_BYTES} bytes"),
    ],
    ids=["missing", "torn", "other-version", "too-large"],
)
async def test_a_stopped_hub_says_in_one_line_why_it_shows_no_link(
    tmp_path: Path, content: str | None, reason: str
) -> None:
    data = tmp_path / "data"
    await stopped_hub(data)
    if content is not None:
        (data / BUDGET_FILE).parent.mkdir(parents=True, exist_ok=True)
        (data / BUDGET_FILE).write_text(content)
    lines, doc = links_of(data)
    assert doc["links"] == []
    assert reason in str(doc["unreadable"])
    assert doc["missing"] is (content is None)
    assert len(lines) == 1
    if content is None:
        assert (
            lines[0]
            == f"links: none counted (no {data / BUDGET_FILE}: a hub without upstream.links, or whose links never sent)"
        )
    else:
        assert lines[0].startswith(f"links: budget file {data / BUDGET_FILE} not read (")
        assert reason in lines[0]
