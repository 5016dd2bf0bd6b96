"""Routes, sources, sinks, the router and the same-endpoint rule (docs/routes.md, "Routes")."""

from __future__ import annotations

import logging

import pytest

from edgehub import Message
from edgehub.core import DEFAULT_PRIORITY
from edgehub.core.endpoints import module_endpoint, parse_module_endpoint
from edgehub.routing import (
    RouteCompileError,
    RouteError,
    Router,
    RouteResult,
    RouteSpec,
    RouteSyntaxError,
    Tri,
    parse_route,
)

DEVICE = Message(body=b"", system_properties={"connectionDeviceId": "d1"})
MODULE = Message(body=b"", system_properties={"connectionDeviceId": "d1", "connectionModuleId": "m1"})
MODULE_OUT = Message(
    body=b"", system_properties={"connectionDeviceId": "d1", "connectionModuleId": "m1", "outputName": "o1"}
)
OTHER_MODULE = Message(body=b"", system_properties={"connectionDeviceId": "d1", "connectionModuleId": "m12"})
TWIN = Message(
    body=b'{"properties": {"reported": {"fw": "1.2"}}}',
    system_properties={"connectionDeviceId": "d1", "messageType": "twinChangeNotification"},
)


def test_parse_route_gives_source_condition_and_sink_as_written() -> None:
    r = parse_route("FROM /messages/* WHERE alert = 'yes' INTO $upstream")
    assert (r.source, r.condition, r.sink, r.endpoint) == ("/messages/*", "alert = 'yes'", "$upstream", "$upstream")
    r2 = parse_route("select * from /messages into BrokeredEndpoint('/modules/m2/inputs/in1')")
    assert r2.condition == "true"
    assert r2.endpoint == "/modules/m2/inputs/in1"
    assert parse_route('FROM /* INTO brokeredendpoint("/modules/a/inputs/b")').endpoint == "/modules/a/inputs/b"
    assert parse_route("FROM /* INTO $UPSTREAM").endpoint == "$upstream"


@pytest.mark.parametrize(
    ("source", "matches"),
    [
        ("/*", {"device", "module", "module_out", "other", "twin"}),
        ("/messages", {"device", "module", "module_out", "other"}),
        ("/messages/*", {"device", "module", "module_out", "other"}),
        ("/MESSAGES/*", {"device", "module", "module_out", "other"}),
        ("/messages/modules/*", {"module", "module_out", "other"}),
        ("/messages/modules/m1", {"module", "module_out"}),
        ("/messages/modules/m1/*", {"module", "module_out"}),
        ("/messages/modules/M1/outputs/o1", {"module_out"}),
        ("/messages/modules/m1/outputs/*", {"module_out"}),
        ("/messages/*/m1", set()),
        ("/twinChangeNotifications", {"twin"}),
    ],
)
def test_source_matching_is_a_case_insensitive_path_prefix(source: str, matches: set[str]) -> None:
    router = Router({"r": f"FROM {source} INTO $upstream"})
    msgs = {"device": DEVICE, "module": MODULE, "module_out": MODULE_OUT, "other": OTHER_MODULE, "twin": TWIN}
    assert {name for name, m in msgs.items() if router.route(m)} == matches


@pytest.mark.parametrize(
    ("route", "error", "fragment", "column"),
    [
        ("FROM /* INTO $upstream WHERE x = 'y'", RouteSyntaxError, "after the end of the route", 24),
        ("FROM /* INTO $downstream", RouteCompileError, "unknown sink '$downstream'", 14),
        ("FROM /* INTO Endpoint('/modules/a/inputs/b')", RouteCompileError, "unknown sink function", 14),
        ("FROM /* INTO BrokeredEndpoint('/modules/a/outputs/b')", RouteCompileError, "BrokeredEndpoint needs", 14),
        ("FROM /* INTO BrokeredEndpoint('/modules/a/inputs/b/c')", RouteCompileError, "BrokeredEndpoint needs", 14),
        ("FROM /* WHERE temp > 50 INTO $upstream", RouteCompileError, "not string and number", 20),
        ("FROM /* INTO", RouteSyntaxError, "unexpected end of route", 13),
        ("/* INTO $upstream", RouteSyntaxError, "unexpected '/'", 1),
        ("FROM messages INTO $upstream", RouteSyntaxError, "unexpected 'messages'", 6),
    ],
)
def test_bad_routes_are_refused_with_their_position(
    route: str, error: type[RouteError], fragment: str, column: int
) -> None:
    with pytest.raises(error) as info:
        parse_route(route)
    assert fragment in str(info.value)
    assert info.value.column == column


@pytest.mark.parametrize("module_id", ["m", "filter-1", "ünï", "a:b"])
def test_a_brokered_endpoint_names_the_module_input_core_builds(module_id: str) -> None:
    route = parse_route(f"FROM /* INTO BrokeredEndpoint('/modules/{module_id}/inputs/in1')")
    assert route.endpoint == module_endpoint(module_id, "in1")
    assert parse_module_endpoint(route.endpoint) == (module_id, "in1")


@pytest.mark.parametrize(
    "argument", ["/modules/m/inputs/", "/modules//inputs/i", "modules/m/inputs/i", "//modules/m/inputs/i", "$upstream"]
)
def test_a_brokered_endpoint_core_does_not_parse_is_refused(argument: str) -> None:
    assert parse_module_endpoint(argument) is None
    with pytest.raises(RouteCompileError, match="BrokeredEndpoint needs"):
        parse_route(f"FROM /* INTO BrokeredEndpoint('{argument}')")


def test_router_reports_every_bad_route_by_name() -> None:
    with pytest.raises(RouteError) as info:
        Router(
            {
                "good": "FROM /* INTO $upstream",
                "bad1": "FROM /* INTO $nope",
                "bad2": "FROM /* WHERE 1 + 'a' = 1 INTO $x",
            }
        )
    text = str(info.value)
    assert "route 'bad1'" in text
    assert "route 'bad2'" in text
    assert "good" not in text
    assert len(info.value.problems) == 3


def test_router_returns_priority_and_ttl_of_the_route() -> None:
    router = Router(
        {
            "r1": RouteSpec(route="FROM /messages/* INTO $upstream", priority=0, time_to_live_secs=60),
            "r2": 'FROM /messages/modules/m1/* INTO BrokeredEndpoint("/modules/m2/inputs/in1")',
        }
    )
    assert router.route(MODULE_OUT) == [
        RouteResult(endpoint="$upstream", priority=0, ttl_s=60),
        RouteResult(endpoint="/modules/m2/inputs/in1", priority=DEFAULT_PRIORITY, ttl_s=None),
    ]
    assert router.route(DEVICE) == [RouteResult(endpoint="$upstream", priority=0, ttl_s=60)]


def test_ttl_zero_means_the_global_ttl() -> None:
    router = Router({"r": RouteSpec(route="FROM /* INTO $upstream", priority=3, time_to_live_secs=0)})
    assert router.route(DEVICE) == [RouteResult(endpoint="$upstream", priority=3, ttl_s=None)]


def test_same_endpoint_is_queued_once_at_the_highest_priority_with_that_routes_ttl() -> None:
    router = Router(
        {
            "low": RouteSpec(route="FROM /* INTO $upstream", priority=7, time_to_live_secs=100),
            "high": RouteSpec(route="FROM /messages/* INTO $UPSTREAM", priority=2, time_to_live_secs=30),
            "none": RouteSpec(route="FROM /* INTO $upstream"),
            "module": RouteSpec(route="FROM /* INTO BrokeredEndpoint('/modules/x/inputs/y')", priority=9),
        }
    )
    assert router.route(DEVICE) == [
        RouteResult(endpoint="$upstream", priority=2, ttl_s=30),
        RouteResult(endpoint="/modules/x/inputs/y", priority=9, ttl_s=None),
    ]


def test_same_priority_keeps_the_longer_ttl() -> None:
    router = Router(
        {
            "a": RouteSpec(route="FROM /* INTO $upstream", priority=1, time_to_live_secs=10),
            "b": RouteSpec(route="FROM /* INTO $upstream", priority=1, time_to_live_secs=50),
        }
    )
    assert router.route(DEVICE) == [RouteResult(endpoint="$upstream", priority=1, ttl_s=50)]


def test_only_true_routes_and_undefined_is_counted() -> None:
    router = Router({"r": "FROM /* WHERE missing = 'x' INTO $upstream"})
    assert router.route(DEVICE) == []
    assert router.undefined_count == 1


def test_undefined_verdicts_are_logged_at_debug_with_the_route_names(caplog: pytest.LogCaptureFixture) -> None:
    router = Router(
        {
            "a": "FROM /* WHERE missing = 'x' INTO $upstream",
            "b": "FROM /* WHERE true INTO $upstream",
            "c": "FROM /* WHERE as_number(other) > 1 INTO $upstream",
        }
    )
    with caplog.at_level(logging.DEBUG, logger="edgehub.routing.router"):
        assert [r.endpoint for r in router.route(DEVICE)] == ["$upstream"]
    assert router.undefined_count == 2
    assert [r.getMessage() for r in caplog.records] == ["route.undefined routes=a,c source=/messages"]


def test_route_spec_validates_priority_and_ttl() -> None:
    with pytest.raises(ValueError):
        RouteSpec(route="FROM /* INTO $upstream", priority=10)
    with pytest.raises(ValueError):
        RouteSpec(route="FROM /* INTO $upstream", time_to_live_secs=-1)
    with pytest.raises(ValueError):
        RouteSpec(route="FROM /* INTO $upstream", time_to_live_secs=4_294_967_296)


def test_twin_change_includes_only_from_twin_notifications() -> None:
    router = Router(
        {"r": "FROM /twinChangeNotifications WHERE twin_change_includes('properties.reported.fw') INTO $upstream"}
    )
    assert router.route(TWIN) == [RouteResult(endpoint="$upstream")]
    router2 = Router(
        {"r": "FROM /twinChangeNotifications WHERE twin_change_includes('properties.desired.x') INTO $upstream"}
    )
    assert router2.route(TWIN) == []
    with pytest.raises(RouteCompileError, match="only allowed in routes FROM /twinChangeNotifications"):
        parse_route("FROM /messages WHERE twin_change_includes('properties.reported.fw') INTO $upstream")
    with pytest.raises(RouteCompileError, match=r"must start with properties.reported."):
        parse_route("FROM /twinChangeNotifications WHERE twin_change_includes('foo.bar') INTO $upstream")


def test_explain_says_why_each_route_did_or_did_not_match() -> None:
    router = Router(
        {
            "src": "FROM /messages/modules/other/* INTO $upstream",
            "cond": "FROM /* WHERE missing = 'x' INTO $upstream",
            "ok": RouteSpec(route="FROM /* INTO $upstream", priority=4),
        }
    )
    verdicts = {v.name: v for v in router.explain(MODULE)}
    assert not verdicts["src"].source_matched
    assert "is not under" in verdicts["src"].reason
    assert verdicts["cond"].verdict is Tri.UNDEFINED
    assert verdicts["ok"].result == RouteResult(endpoint="$upstream", priority=4)


def test_multiline_routes_report_line_and_column() -> None:
    with pytest.raises(RouteCompileError) as info:
        parse_route("FROM /messages/*\nWHERE\n   temp > 50\nINTO $upstream")
    assert (info.value.line, info.value.column) == (3, 9)
