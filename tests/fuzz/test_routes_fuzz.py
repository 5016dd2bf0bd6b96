"""Fuzzing the route language: random text, grammar-shaped conditions and routes, and their evaluation on
messages of every kind (tests/fuzz/route_checks.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edgehub import Message
from edgehub.routing import Tri
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.route_checks import check_condition, check_route, check_route_text
from tests.fuzz.route_inputs import conditions, messages, route_texts, routes


@fuzz_settings(150)
@given(route_texts())
def test_any_text_is_a_route_error_with_a_position_or_compiles(text: str) -> None:
    check_route_text(text)


@fuzz_settings(200)
@given(conditions(), st.lists(messages(), min_size=1, max_size=4))
def test_grammar_shaped_conditions_compile_or_fail_cleanly_and_never_raise_on_a_message(
    text: str, batch: list[Message]
) -> None:
    check_condition(text, batch)


@fuzz_settings(120)
@given(routes(), st.lists(messages(), min_size=1, max_size=3))
def test_grammar_shaped_routes_compile_or_fail_cleanly_and_route_any_message(text: str, batch: list[Message]) -> None:
    check_route(text, batch)


def test_the_condition_strategy_reaches_compiled_conditions_that_see_the_body() -> None:
    # The checks are not vacuous: a body query over deep or huge JSON evaluates without raising.
    deep = Message(
        b'{"t": 1, "d": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        {},
        {"contentType": "application/json", "contentEncoding": "utf-8"},
    )
    huge = Message(b'{"t": 1' + b"0" * 400 + b"}", {}, {"contentType": "application/json", "contentEncoding": "utf-8"})
    condition = check_condition("$body.t > 0", [deep, huge])
    assert condition is not None
    assert condition(huge) is Tri.TRUE
    assert condition(deep) is Tri.UNDEFINED  # too deep to parse: the body is undefined, not an error
