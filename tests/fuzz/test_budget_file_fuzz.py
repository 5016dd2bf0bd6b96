"""Fuzzing the links' budget file (``DATA_DIR/links/budget.json``): whatever it holds (JSON of any shape, a ledger
with any of its values changed, bytes), ``read_ledger_file`` answers a ``LedgerFile`` or a ``LedgerFileError`` with a
one-line reason, a ledger over it starts (counting from zero when it is unreadable), and a stopped hub's status of it
is lines, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgehub.runtime.admin.links import format_stopped_links, stopped_links_document
from edgehub.testing.clock import ManualClock
from edgehub.upstream.budget import Budget, BudgetLedger, LedgerFileError, Period, read_ledger_file
from tests.fuzz.budget import fuzz_settings

NOW_S = 1_796_650_000.0  # 2026-12-07 13:46 UTC
BUDGETS = (Budget(1_000_000, Period.DAY, 6), Budget(20_000_000, Period.MONTH))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
entries = st.fixed_dictionaries(
    {
        "period": st.sampled_from(["day", "month", "week", ""]) | json_values,
        "startHourUtc": st.integers(-2, 25) | json_values,
        "periodStart": st.floats() | st.integers() | json_values,
        "bytes": st.integers(-5, 2**63) | st.floats() | json_values,
        "mark": st.sampled_from(["under", "80%", "100%", "x"]) | json_values,
        "budgetBytes": st.none() | st.integers(-5, 2**50) | st.floats() | json_values,
    }
)
links = st.fixed_dictionaries(
    {"costPerMiB": st.floats() | st.integers(-1, 10) | json_values, "periods": st.lists(entries, max_size=3)}
)
documents = (
    st.fixed_dictionaries(
        {
            "version": st.sampled_from([1, 2, 3, "2", None]),
            "links": st.dictionaries(
                st.sampled_from(["sat", "cell", "x" * 500, "a\nb"]) | st.text(max_size=4),
                links | entries | json_values,
                max_size=3,
            ),
        }
    )
    | json_values
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file for every example (a test's examples run one after another, and each writes it anew)."""
    return tmp_path_factory.mktemp("budget") / "budget.json"


def reason(path: Path) -> str | None:
    """Why the file cannot be read, or None when it can."""
    try:
        read_ledger_file(path)
    except LedgerFileError as exc:
        return exc.reason
    return None


def check(path: Path) -> None:
    why = reason(path)
    assert why is None or ("\n" not in why and len(why) < 300)  # one short line
    ledger = BudgetLedger(path, {"sat": (BUDGETS, 8.0), "cell": ((), 0.0)}, clock=ManualClock(NOW_S))
    for name in ("sat", "cell"):
        assert all(c.bytes >= 0 for c in ledger.counts(name))
    lines = format_stopped_links(stopped_links_document(path, NOW_S))
    assert lines
    assert all("\n" not in line for line in lines)


@fuzz_settings(200)
@given(documents)
def test_any_json_in_the_budget_file_is_read_or_refused_with_a_reason(scratch: Path, document: Any) -> None:
    scratch.write_text(json.dumps(document))
    check(scratch)


@fuzz_settings(100)
@given(st.binary(max_size=256))
def test_any_bytes_in_the_budget_file_are_read_or_refused_with_a_reason(scratch: Path, raw: bytes) -> None:
    scratch.write_bytes(raw)
    check(scratch)
