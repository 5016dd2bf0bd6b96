"""``edgehub capacity --links``: what a day of traffic costs over the links, and how long the metered link's budget
rides out an outage of the cheap one for the priorities it may carry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgehub.runtime.cli.capacity import capacity
from edgehub.runtime.link_capacity import links_plan
from edgehub.upstream.budget import MIB, Budget, Period
from edgehub.upstream.links import LinkSpec

CELL = LinkSpec(name="cell", cost_per_mib=0.01)
SAT = LinkSpec(
    name="sat",
    cost_per_mib=8.0,
    budget=Budget(5_000_000, Period.DAY),
    priorities=frozenset({0, 1}),
    over_budget=frozenset({0}),
)
ON_WIRE = 1 + 52 / 1448  # the TCP/IP share


def test_a_day_goes_over_the_cheap_link_and_its_cost_is_bytes_times_price() -> None:
    p = links_plan([SAT, CELL], {0: 0.01, 1: 0.2, 5: 5.0}, wire=300)
    cell, sat = {d.name: d for d in p.days}["cell"], {d.name: d for d in p.days}["sat"]
    assert cell.carries == "0-1,5"
    assert sat.carries == ""
    assert cell.bytes_per_day == pytest.approx(5.21 * 300 * ON_WIRE * 86_400)
    assert cell.cost_per_day == pytest.approx(cell.bytes_per_day / MIB * 0.01)
    assert p.cost_per_day == pytest.approx(cell.cost_per_day)
    assert p.outage_of == "cell"


def test_the_metered_budget_rides_out_the_outage_for_its_priorities_then_only_the_alarms_go() -> None:
    p = links_plan([CELL, SAT], {0: 0.01, 1: 0.2, 5: 5.0}, wire=300)
    (share,) = p.outage
    assert share.name == "sat"
    assert share.carries == "0-1"
    assert share.bytes_per_s == pytest.approx(0.21 * 300 * ON_WIRE)
    assert share.rides_out_s == pytest.approx(5_000_000 / share.bytes_per_s)
    assert share.after_budget_carries == "0"
    assert share.after_budget_cost_per_h == pytest.approx(0.01 * 300 * ON_WIRE * 3600 / MIB * 8.0)
    assert p.waits_in_outage == "5"


def test_a_priority_no_link_carries_is_named() -> None:
    p = links_plan([SAT], {0: 1.0, 7: 1.0}, wire=100)
    assert p.never_leaves == "7"


def test_a_month_budget_is_a_thirtieth_a_day_and_an_overrun_is_named() -> None:
    month = LinkSpec(name="sat", cost_per_mib=8.0, budget=Budget(30 * 1_000_000, Period.MONTH))
    (day,) = links_plan([month], {5: 1.0}, wire=100).days
    assert day.budget_bytes_per_day == pytest.approx(1_000_000)
    assert day.over_budget  # 100 B a second is 8.6 MB a day


def test_bad_traffic_is_refused() -> None:
    with pytest.raises(ValueError, match="positive rate"):
        links_plan([CELL], {0: 0.0}, wire=100)


MANIFEST = {
    "schemaVersion": "1.1",
    "routes": {
        "alarms": {"route": "FROM /messages/* WHERE $body.kind = 'alarm' INTO $upstream", "priority": 0},
        "telemetry": {"route": "FROM /messages/* INTO $upstream", "priority": 5},
    },
    "upstream": {
        "links": [
            {"name": "cell", "address": "cell.example:8883", "costPerMiB": 0.01, "linkRateBps": 256000},
            {
                "name": "sat",
                "address": "sat.example:8883",
                "costPerMiB": 8,
                "priorities": "0-1",
                "budget": {"bytes": 5_000_000, "period": "day"},
                "allowedOverBudget": "0",
            },
        ]
    },
}


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    manifest = tmp_path / "deployment.json"
    manifest.write_text(json.dumps(MANIFEST))
    result = CliRunner().invoke(capacity, ["--message-bytes", "300", "--ttl", "1d", "--links", str(manifest), *args])
    return result.exit_code, result.output


def test_the_command_answers_a_days_cost_and_the_outage_the_budget_rides_out(tmp_path: Path) -> None:
    code, out = run(tmp_path, "--traffic", "0=0.01/s", "--traffic", "1=0.2/s", "--traffic", "5=5/s")
    assert code == 0, out
    assert "a day with every link up costs" in out
    assert "while cell is down:" in out
    assert "sat takes 0-1" in out
    assert "then only 0 goes on" in out
    assert "priorities 5 wait in the store" in out
    code, out = run(tmp_path, "--traffic", "0=0.01/s", "--traffic", "5=5/s", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["links"]["outage"][0]["name"] == "sat"
    assert doc["rate_per_s"] == pytest.approx(5.01)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--traffic", "0"), "PRIORITY=RATE"),
        (("--traffic", "0=1/s", "--traffic", "0=2/s"), "given twice"),
        (("--traffic", "12=1/s"), "outside 0-10"),
    ],
)
def test_bad_traffic_on_the_command_line_is_a_usage_error(tmp_path: Path, args: tuple[str, ...], named: str) -> None:
    code, out = run(tmp_path, *args)
    assert code == 2
    assert named in out


def test_a_manifest_without_links_is_a_usage_error(tmp_path: Path) -> None:
    manifest = tmp_path / "plain.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1"}))
    result = CliRunner().invoke(
        capacity, ["--message-bytes", "300", "--ttl", "1d", "--rate", "1/s", "--links", str(manifest)]
    )
    assert result.exit_code == 2
    assert "has no upstream.links" in result.output
