"""The properties the route language keeps on any input; the tests in this folder and ``python -m bench.fuzz``
run them.

* Compiling text (a condition, a route, a router of routes) raises only ``RouteError``s, each with a 1-based
  line and column inside the text and a message that renders.
* A compiled condition, on any message, gives a verdict and never raises; the same message gives the same one.
* The router, on any message, gives RouteResults and never raises.
"""

from __future__ import annotations

from edgehub import Message
from edgehub.routing import Condition, RouteError, Router, Tri, compile_condition, parse_route

__all__ = ["check_condition", "check_route", "check_route_text"]


def _check_error(text: str, err: RouteError) -> None:
    lines = text.splitlines() or [""]
    assert err.problems
    for p in err.problems:
        assert 1 <= p.line <= max(len(lines), text.count("\n") + 1), (p, text)
        assert p.column >= 1, p
    str(err)  # renders, caret and all


def compiled(text: str) -> Condition | None:
    try:
        return compile_condition(text)
    except RouteError as err:
        _check_error(text, err)
        return None


def check_condition(text: str, messages: list[Message]) -> Condition | None:
    condition = compiled(text)
    if condition is not None:
        for m in messages:
            verdict = condition(m)
            assert isinstance(verdict, Tri)
            assert condition(m) is verdict
    return condition


def check_route(text: str, messages: list[Message]) -> None:
    try:
        parse_route(text)
        router = Router({"r": text, "all": "FROM /* INTO $upstream"})
    except RouteError as err:
        _check_error(text, err)
        return
    for m in messages:
        results = router.route(m)
        assert any(r.endpoint == "$upstream" for r in results)
        router.explain(m)


def check_route_text(text: str) -> None:
    """Arbitrary text as a condition and as a route: a RouteError with a position, or a compiled thing."""
    compiled(text)
    try:
        parse_route(text)
    except RouteError as err:
        _check_error(text, err)
