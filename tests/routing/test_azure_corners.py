"""The route language's corners where Azure IoT Edge's behaviour is not what a reader would guess.

Each table states Azure's behaviour; a row that fails is a place where edgehub and Azure IoT Edge disagree.
The sources of truth are Azure IoT Edge's routing core (``Microsoft.Azure.Devices.Routing.Core``: the
``Null`` and ``Bool`` query types, its type checker) and the rules of the issue.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from edgehub import Message
from edgehub.routing import RouteCompileError, Router, Tri, compile_condition, parse_route

T, F, U = Tri.TRUE, Tri.FALSE, Tri.UNDEFINED

BODY = {
    "x": {"Temperature": 21.5, "Location": {"State": "WA"}, "Flag": True, "Nothing": None},
    "Welcome!": {"x": 1},
    "I'mnotusingspaces%1": {"es": "yes"},
    "a*b": 2,
}
JSON_MESSAGE = Message(
    body=json.dumps(BODY).encode(),
    properties={"nothing": None, "p": "v"},
    system_properties={"contentType": "application/json", "contentEncoding": "utf-8"},
)


def verdict(cond: str) -> Tri:
    return compile_condition(cond)(JSON_MESSAGE)


@pytest.mark.parametrize(
    "cond",
    [
        "3 + undefined",
        "undefined + 3",
        "null * 2",
        "2 - null",
        "- null",  # with a space: "-null" is a property name, as "temp-1" is
        "- undefined",
        "'a' || null",
        "lower(null)",
        "upper(undefined)",
        "length(null)",
        "concat('a', null)",
        "concat(undefined, 'a')",
        "starts_with(null, 'x')",
        "ends_with('x', undefined)",
        "contains(null, 'x')",
        "index_of('x', null)",
        "substring(null, 1)",
        "substring('abc', null)",
        "power(2, null)",
        "abs(undefined)",
        "sqrt(null)",
        "as_number(null)",
    ],
)
def test_a_literal_null_or_undefined_where_a_number_or_string_is_needed_does_not_compile(cond: str) -> None:
    # Azure's type checker refuses these; this router once compiled them (and evaluated to undefined).
    with pytest.raises(RouteCompileError) as info:
        compile_condition(cond)
    assert re.search(r"not (\w+ and )?(null|undefined)\b", str(info.value))


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        # null and undefined still stand where a bool, a comparison or an is_* function takes them
        ("null = null", T),
        ("undefined = 1", U),
        ("is_null(null)", T),
        ("is_defined(undefined)", F),
        ("NOT null", T),
        ("(null ?? 'd') = 'd'", U),
        # a property that holds null is a null string, not a literal: the functions take it
        ("concat(nothing, 'a') = 'a'", T),
        ("is_defined(lower(nothing))", F),
        # body values stay dynamic
        ("$body.x.Nothing + 1 = 1", U),
    ],
)
def test_null_and_undefined_where_they_are_allowed(cond: str, expected: Tri) -> None:
    assert verdict(cond) is expected


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        # Azure: Null & Bool, Bool & Null and Null & Null are null; Null | Bool is the bool; Null | Null is null.
        ("(null AND true) = null", T),
        ("(true AND null) = null", T),
        ("(null AND false) = null", T),
        ("(null AND null) = null", T),
        ("(null OR null) = null", T),
        ("(null OR true) = true", T),
        ("(false OR null) = false", T),
        ("(null OR (p = 'v')) = true", T),
        ("is_null(null AND true)", T),
        # as a whole condition, null is FALSE
        ("null AND true", F),
        ("null OR null", F),
        ("null OR true", T),
        ("NOT (null AND true)", T),
    ],
)
def test_null_in_the_logical_operators(cond: str, expected: Tri) -> None:
    assert verdict(cond) is expected


@pytest.mark.parametrize("cond", ["", " ", "\t\n", "/* nothing */"])
def test_an_empty_or_blank_condition_is_undefined(cond: str) -> None:
    assert verdict(cond) is U


def test_a_route_whose_where_is_empty_never_matches_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edgehub.routing.router"):
        router = Router({"r": "FROM /* WHERE INTO $upstream"})
    assert router.route(JSON_MESSAGE) == []
    assert [r.message for r in caplog.records if "route.empty_condition" in r.message]


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        # body values of different JSON types, null included, compare unequal (Azure)
        ("$body.x.Temperature != null", T),
        ("$body.x.Temperature = null", F),
        ("$body.x.Location.State <> null", T),
        ("$body.x.Flag <> null", T),
        ("$body.x.missingKey <> '100'", T),
        ("$body.x.missingKey = '100'", F),
        ("$body.x.missingKey = null", T),
        ("$body.x.Nothing = null", T),
        ("$body.x.Nothing <> 5", T),
        ("null <> $body.x.Temperature", T),
        # ordering across types stays undefined
        ("$body.x.Temperature > null", U),
        ("$body.x.missingKey < '100'", U),
        # a property (a string) against null is still Azure's string-vs-Null: undefined
        ("p <> null", U),
        ("nothing = null", T),
    ],
)
def test_body_values_against_null_and_other_types(cond: str, expected: Tri) -> None:
    assert verdict(cond) is expected


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        ("is_defined(substring('abc', 3))", F),
        ("is_defined(substring('abc', 3, 0))", F),
        ("is_defined(substring('abc', 4))", F),
        ("is_defined(substring('', 0))", F),
        ("substring('abc', 3) = ''", U),
        ("substring('abc', 2) = 'c'", T),
        ("substring('abc', 2, 1) = 'c'", T),
    ],
)
def test_substring_from_the_end_or_past_it_is_undefined(cond: str, expected: Tri) -> None:
    assert verdict(cond) is expected


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        ("$body.Welcome!.x = 1", T),
        ("$body.I'mnotusingspaces%1.es = 'yes'", T),
        ("$body.a*b = 2", T),
        ("{$body.Welcome!.x} = 1", T),
    ],
)
def test_body_paths_take_any_character_but_dot_brackets_and_space(cond: str, expected: Tri) -> None:
    assert verdict(cond) is expected


@pytest.mark.parametrize("cond", ["$body.a[] = 1", "$body.a['b'] = 1", "$body.a[x] = 1"])
def test_body_paths_still_refuse_empty_brackets_and_quoted_keys(cond: str) -> None:
    with pytest.raises(RouteCompileError, match="unsupported body query"):
        compile_condition(cond)


DEVICE = Message(body=b"", system_properties={"connectionDeviceId": "d1"})
MODULE_OUT = Message(
    body=b"", system_properties={"connectionDeviceId": "d1", "connectionModuleId": "m1", "outputName": "o1"}
)
TWIN = Message(body=b"{}", system_properties={"connectionDeviceId": "d1", "messageType": "twinChangeNotification"})


@pytest.mark.parametrize(
    ("source", "same_as"),
    [
        ("/", "/*"),
        ("/messages/", "/messages"),
        ("/messages/modules/", "/messages/modules"),
        ("/MESSAGES/", "/messages"),
    ],
)
def test_a_trailing_slash_source_matches_what_its_twin_matches(source: str, same_as: str) -> None:
    def matched(src: str) -> list[bool]:
        router = Router({"r": f"FROM {src} INTO $upstream"})
        return [bool(router.route(m)) for m in (DEVICE, MODULE_OUT, TWIN)]

    assert parse_route(f"FROM {source} INTO $upstream").source == source
    assert matched(source) == matched(same_as)
