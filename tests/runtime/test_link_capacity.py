"""``edgehub capacity --links``: what a day of traffic costs over the links, and how long the metered link's budget
rides out an outage of the cheap one for the priorities it may carry."""

from __future__ import annotations

import copy
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
    budgets=(Budget(5_000_000, Period.DAY),),
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
    assert share.bytes_per_s * 86_400 > 5_000_000  # a day of it spends the day's budget
    assert (share.budget_period, share.budget_bytes) == ("day", 5_000_000)
    assert share.rides_out_s == pytest.approx(5_000_000 / share.bytes_per_s)
    assert share.after_budget_carries == "0"
    assert share.after_budget_cost_per_h == pytest.approx(0.01 * 300 * ON_WIRE * 3600 / MIB * 8.0)
    assert p.waits_in_outage == "5"


def test_a_priority_no_link_carries_is_named() -> None:
    p = links_plan([SAT], {0: 1.0, 7: 1.0}, wire=100)
    assert p.never_leaves == "7"


def test_a_month_budget_says_how_many_days_of_the_traffic_it_lasts() -> None:
    month = LinkSpec(name="sat", cost_per_mib=8.0, budgets=(Budget(30 * 1_000_000, Period.MONTH),))
    (day,) = links_plan([month], {5: 1.0}, wire=100).days
    assert day.month_budget_bytes == 30_000_000
    assert day.month_budget_lasts_days == pytest.approx(30_000_000 / (100 * ON_WIRE * 86_400))
    assert day.over_month_budget  # 100 B a second is 8.9 MB a day: 3.4 days of it
    assert day.day_budget_bytes is None
    assert not day.over_day_budget
    (light,) = links_plan([month], {5: 0.01}, wire=100).days
    assert light.month_budget_lasts_days is not None
    assert light.month_budget_lasts_days > 31
    assert not light.over_month_budget


def test_a_day_and_a_month_budget_each_say_their_part_and_the_first_to_run_out_bounds_the_outage() -> None:
    sat = LinkSpec(
        name="sat",
        cost_per_mib=8.0,
        budgets=(Budget(1_000_000, Period.DAY), Budget(20_000_000, Period.MONTH)),
        priorities=frozenset({0, 1}),
        over_budget=frozenset({0}),
    )
    p = links_plan([CELL, sat], {1: 0.2, 5: 5.0}, wire=300)
    (share,) = p.outage
    per_day = share.bytes_per_s * 86_400  # about 5.2 MB: over the day's budget, a quarter of the month's
    assert 1_000_000 < per_day < 20_000_000
    assert (share.budget_period, share.budget_bytes) == ("day", 1_000_000)
    assert share.rides_out_s == pytest.approx(1_000_000 / share.bytes_per_s)
    assert share.after_budget_carries == ""  # nothing of 0 in this traffic: once a day's budget is spent, nothing
    assert share.month_budget_lasts_days == pytest.approx(20.0)  # a day of the outage takes the day's 1 MB
    # With alarms in the traffic, they go on past the day's budget for the rest of each day, on the month's bytes.
    (alarms,) = links_plan([CELL, sat], {0: 0.01, 1: 0.2, 5: 5.0}, wire=300).outage
    alarm_per_s = 0.01 * 300 * ON_WIRE
    per_day = 1_000_000 + alarm_per_s * (86_400 - 1_000_000 / alarms.bytes_per_s)
    assert alarms.month_budget_lasts_days == pytest.approx(20_000_000 / per_day)
    # At a tenth of the rate a day of it fits in the day's budget: the month's runs out first, after its bytes.
    (slow,) = links_plan([CELL, sat], {1: 0.02, 5: 5.0}, wire=300).outage
    assert slow.bytes_per_s * 86_400 < 1_000_000
    assert slow.budget_period == "month"
    assert slow.rides_out_s == pytest.approx(20_000_000 / slow.bytes_per_s)
    assert slow.month_budget_lasts_days == pytest.approx(20_000_000 / (slow.bytes_per_s * 86_400))
    # Over the metered link as the only one that carries 1: the day overruns its day budget; the month says its days.
    (day,) = links_plan([sat], {1: 0.2}, wire=300).days
    assert day.over_day_budget
    assert day.month_budget_lasts_days == pytest.approx(20_000_000 / day.bytes_per_day)


def test_a_day_budget_a_day_of_the_outage_does_not_spend_never_runs_out() -> None:
    roomy = LinkSpec(name="sat", cost_per_mib=8.0, budgets=(Budget(10**9, Period.DAY),), priorities=frozenset({0}))
    (share,) = links_plan([CELL, roomy], {0: 1.0}, wire=300).outage
    assert (share.budget_period, share.budget_bytes, share.rides_out_s) == ("day", 10**9, None)


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
    assert "its day budget (4.8 MiB) rides out" in out
    assert "priorities 5 wait in the store" in out
    code, out = run(tmp_path, "--traffic", "0=0.01/s", "--traffic", "5=5/s", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["links"]["outage"][0]["name"] == "sat"
    assert doc["rate_per_s"] == pytest.approx(5.01)


def test_the_command_says_what_a_day_and_a_month_budget_allow(tmp_path: Path) -> None:
    """The metered link alone carries the events (cell may carry only telemetry): its day says its cost, that it
    overruns the day's budget, and how many days of it the month's budget lasts."""
    manifest = copy.deepcopy(MANIFEST)
    cell, sat = manifest["upstream"]["links"]  # type: ignore[index]
    cell["priorities"] = "5"
    sat["budget"] = [{"bytes": 1_000_000, "period": "day"}, {"bytes": 20_000_000, "period": "month", "startHourUtc": 3}]
    path = tmp_path / "two.json"
    path.write_text(json.dumps(manifest))
    result = CliRunner().invoke(
        capacity,
        ["--message-bytes", "300", "--ttl", "1d", "--links", str(path), "--traffic", "0=0.2/s", "--traffic", "5=1/s"],
    )
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("  sat: carries 0;")]
    per_day = 0.2 * 302 * ON_WIRE * 86_400  # 302 B a message on the wire for 300 B bodies (the plan's first line)
    assert "links (a message is 302 B on the wire" in result.output
    assert f"cost {per_day / MIB * 8:,.2f}" in line
    assert "over its day budget (976.6 KiB)" in line
    assert f"its month budget (19.1 MiB) lasts {20_000_000 / per_day:,.1f} days of this (not a whole month)" in line


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
