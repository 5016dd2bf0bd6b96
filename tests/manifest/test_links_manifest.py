"""``upstream.links`` in the manifest: a good pair of links is taken, and each bad one is refused with its path."""

from __future__ import annotations

from typing import Any

import pytest

from edgehub.manifest import ManifestError, load_desired

ROUTES = {
    "alarms": {"route": "FROM /messages/* WHERE $body.kind = 'alarm' INTO $upstream", "priority": 0},
    "events": {"route": "FROM /messages/* WHERE $body.kind = 'event' INTO $upstream", "priority": 1},
    "telemetry": {"route": "FROM /messages/* INTO $upstream", "priority": 5},
}
CELL = {"name": "cell", "address": "cell.example:8883", "tls": True, "passwordEnv": "CELL_PASSWORD"}
SAT = {
    "name": "sat",
    "address": "sat.example:8883",
    "costPerMiB": 8.5,
    "priorities": "0-1",
    "budget": {"bytes": 20_000_000, "period": "day", "startHourUtc": 6},
    "allowedOverBudget": "0",
    "linkRateBps": 32_000,
    "linkRttMs": 700,
}


def desired(links: list[dict[str, Any]], routes: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"schemaVersion": "1.1", "routes": ROUTES if routes is None else routes, "upstream": {"links": links}}


def problems(links: list[dict[str, Any]], routes: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_desired(desired(links, routes))
    return list(info.value.errors)


def test_a_cheap_and_a_metered_link_are_taken() -> None:
    d = load_desired(desired([CELL, SAT]))
    links = d.upstream.links
    assert links is not None
    assert [link.name for link in links] == ["cell", "sat"]
    assert links[1].carried == frozenset({0, 1})
    assert [(b.period, b.startHourUtc) for b in links[1].budgets] == [("day", 6)]


def test_a_day_and_a_month_budget_are_taken_as_a_list() -> None:
    month = {"bytes": 300_000_000, "period": "month", "startHourUtc": 3}
    d = load_desired(desired([CELL, {**SAT, "budget": [SAT["budget"], month]}]))
    assert d.upstream.links is not None
    assert [(b.period, b.bytes) for b in d.upstream.links[1].budgets] == [("day", 20_000_000), ("month", 300_000_000)]
    one = load_desired(desired([CELL, {**SAT, "budget": [month], "allowedOverBudget": "0"}]))
    assert one.upstream.links is not None
    assert [b.period for b in one.upstream.links[1].budgets] == ["month"]


def test_a_manifest_without_links_is_the_single_upstream_of_before() -> None:
    assert load_desired({"schemaVersion": "1.1", "routes": ROUTES}).upstream.links is None


def test_two_links_of_one_name_are_refused() -> None:
    assert problems([CELL, {**SAT, "name": "cell"}]) == [
        "upstream.links: links[1].name 'cell' is the name of links[0] too"
    ]


def test_a_budget_without_a_period_is_refused() -> None:
    assert problems([CELL, {**SAT, "budget": {"bytes": 1000}}]) == [
        "upstream.links.1.budget.period: required key missing"
    ]


@pytest.mark.parametrize(
    ("budget", "problem"),
    [
        ([], "upstream.links.1.budget: List should have at least 1 item"),
        (
            [{"bytes": 1, "period": "day"}, {"bytes": 2, "period": "month"}, {"bytes": 3, "period": "month"}],
            "upstream.links.1.budget: List should have at most 2 items",
        ),
        (
            [{"bytes": 1, "period": "day"}, {"bytes": 2, "period": "day", "startHourUtc": 6}],
            "upstream.links.1.budget: budget[1].period 'day' is the period of budget[0] too",
        ),
        ([{"bytes": 1, "period": "day"}, {"bytes": 2}], "upstream.links.1.budget.1.period: required key missing"),
        ([{"bytes": 0, "period": "month"}], "upstream.links.1.budget.0.bytes: Input should be greater than"),
        ("20 MB", "upstream.links.1.budget: Input should be a valid dictionary"),
    ],
    ids=["empty", "three", "same-period", "no-period", "no-bytes", "not-an-object"],
)
def test_a_bad_list_of_budgets_is_refused_with_its_path(budget: object, problem: str) -> None:
    found = problems([CELL, {**SAT, "budget": budget}])
    assert len(found) == 1
    assert found[0].startswith(problem)


def test_a_cost_that_is_not_a_number_is_refused() -> None:
    found = problems([{**CELL, "costPerMiB": "cheap"}, SAT])
    assert found
    assert all(p.startswith("upstream.links.0.costPerMiB") for p in found)


def test_a_routed_priority_no_link_carries_is_refused_and_named() -> None:
    found = problems([{**CELL, "priorities": "0-4"}, SAT])
    assert len(found) == 1
    assert "routes.telemetry (priority 5)" in found[0]
    assert "could never leave" in found[0]


def test_a_route_without_a_priority_needs_a_link_for_the_default_priority() -> None:
    routes = {"all": "FROM /messages/* INTO $upstream"}
    assert "routes.all (priority 10)" in problems([{**CELL, "priorities": "0-9"}], routes)[0]


@pytest.mark.parametrize(
    ("change", "where", "what"),
    [
        ({"password": "hunter2"}, "upstream.links.0.password", "unknown key"),
        ({"priorities": "2-0"}, "upstream.links.0", "runs backwards"),
        ({"priorities": "0-11"}, "upstream.links.0", "outside 0-10"),
        ({"address": "no-port"}, "upstream.links.0", "host:port"),
        ({"name": "a b"}, "upstream.links.0", "letters, digits"),
        ({"passwordFile": "/run/secrets/p"}, "upstream.links.0", "not both"),
        ({"allowedOverBudget": "0"}, "upstream.links.0", "without a budget"),
        ({"keyFile": "/etc/edgehub/cell.key"}, "upstream.links.0", "keyFile is the key of certFile"),
    ],
)
def test_a_bad_link_is_refused_with_its_path(change: dict[str, Any], where: str, what: str) -> None:
    found = problems([{**CELL, **change}, SAT])
    assert len(found) == 1
    assert found[0].startswith(where)
    assert what in found[0]


def test_allowed_over_budget_must_be_among_the_links_priorities() -> None:
    assert (
        "allowedOverBudget 5 is not among its priorities 0-1"
        in problems([CELL, {**SAT, "allowedOverBudget": "0,5"}])[0]
    )


def test_an_upload_link_needs_a_url() -> None:
    assert "needs url" in problems([{"name": "lake", "transport": "upload"}])[0]
    d = load_desired(desired([{"name": "lake", "transport": "upload", "url": "/data/landing"}]))
    assert d.upstream.links is not None


@pytest.mark.parametrize(
    ("key", "value"), [("username", "u"), ("tls", True), ("keepaliveSecs", 20), ("linkRttMs", 700)]
)
def test_an_upload_link_refuses_the_keys_only_mqtt_uses(key: str, value: object) -> None:
    found = problems([{"name": "lake", "transport": "upload", "url": "/data/landing", key: value}])
    assert found == [f"upstream.links.0: link 'lake': {key} only for mqtt links"]
