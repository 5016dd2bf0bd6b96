"""The route language's bounds: deep nesting and huge texts are refused with a position, never a RecursionError
(found by fuzzing: 10,000 parentheses, or a chain of 5,000 ANDs, blew Python's recursion limit), and numbers
beyond the double range are infinite, never an OverflowError."""

from __future__ import annotations

import pytest

from edgehub import Message
from edgehub.routing import Router, RouteSyntaxError, Tri, compile_condition, parse_route
from edgehub.routing.parser import MAX_NESTING, MAX_TEXT_CHARS

JSON = {"contentType": "application/json", "contentEncoding": "utf-8"}


@pytest.mark.parametrize(
    "condition",
    [
        "(" * 10_000 + "true" + ")" * 10_000,
        "NOT " * 5_000 + "true",
        "abs(" * 3_000 + "1" + ")" * 3_000 + " = 1",
        " OR ".join(["a = 'x'"] * 2_000),
    ],
)
def test_nesting_past_the_limit_is_a_syntax_error_with_a_position(condition: str) -> None:
    with pytest.raises(RouteSyntaxError, match=f"nested deeper than {MAX_NESTING} levels") as err:
        compile_condition(condition)
    assert 1 <= err.value.column <= len(condition)


def test_a_deep_route_in_a_router_is_refused_with_its_name() -> None:
    deep = "FROM /messages WHERE " + "(" * 10_000 + "true" + ")" * 10_000 + " INTO $upstream"
    with pytest.raises(RouteSyntaxError, match="route 'deep'"):
        Router({"ok": "FROM /* INTO $upstream", "deep": deep})
    with pytest.raises(RouteSyntaxError, match="nested deeper"):
        parse_route(deep)


def test_conditions_within_the_limit_compile_and_evaluate_at_every_shape() -> None:
    # The deepest of each shape that is allowed must compile and evaluate: three frames a level stay in bounds.
    message = Message(b'{"n": 2}', {"a": "x"}, JSON)
    ors = " OR ".join(["a = 'y'"] * (MAX_NESTING - 3) + ["a = 'x'"])
    assert compile_condition(ors)(message) is Tri.TRUE
    calls = "concat(" * (MAX_NESTING // 2 - 2) + "a" + ", 'b', 'c')" * (MAX_NESTING // 2 - 2) + " <> ''"
    assert compile_condition(calls)(message) is Tri.TRUE
    parens = "(" * (MAX_NESTING - 3) + "$body.n = 2" + ")" * (MAX_NESTING - 3)
    assert compile_condition(parens)(message) is Tri.TRUE


def test_text_over_the_length_limit_is_refused_before_it_is_tokenized() -> None:
    long = "a = '" + "x" * MAX_TEXT_CHARS + "'"
    with pytest.raises(RouteSyntaxError, match=f"over the limit of {MAX_TEXT_CHARS}") as err:
        compile_condition(long)
    assert (err.value.line, err.value.column) == (1, MAX_TEXT_CHARS + 1)  # the first character past it
    with pytest.raises(RouteSyntaxError, match="over the limit"):
        parse_route("FROM /messages WHERE " + long + " INTO $upstream")


def test_a_module_input_that_is_not_valid_unicode_is_not_an_endpoint() -> None:
    # A \uD800 escape in the sink gives a lone surrogate, which no UTF-8 queue name or topic can carry.
    from edgehub.routing import RouteCompileError

    with pytest.raises(RouteCompileError, match="BrokeredEndpoint needs"):
        parse_route(r'FROM /messages INTO BrokeredEndpoint("/modules/m\uD800/inputs/in")')
    assert parse_route(r'FROM /messages INTO BrokeredEndpoint("/modules/m\u00e9/inputs/in")').endpoint == (
        "/modules/mé/inputs/in"
    )


@pytest.mark.parametrize("literal", ["0x" + "F" * 300, "1" + "0" * 400, "1e999"])
def test_number_literals_beyond_the_double_range_are_infinite(literal: str) -> None:
    # A hex literal over the double range raised OverflowError (found by fuzzing); decimal ones were infinite.
    assert compile_condition(f"{literal} > 1e308")(Message()) is Tri.TRUE
