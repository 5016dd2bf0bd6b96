"""Routes and the router.

A route is ``[SELECT *] FROM <source> [WHERE <condition>] INTO <sink>``. Endpoint ids, used by queues, the
executor and the heads (spelled, built and parsed in ``edgehub.core.endpoints``):

* ``$upstream`` (any case) → ``"$upstream"``
* ``BrokeredEndpoint("/modules/{m}/inputs/{i}")`` (function name in any case, either quotes) →
  ``"/modules/{m}/inputs/{i}"``
* ``BrokeredEndpoint("/devices/{d}/messages/devicebound")`` → that id: device ``d``'s cloud-to-device queue

Source matching: the route's source is trimmed, loses one trailing ``*`` and then one trailing ``/``; it matches
a message whose source, compared case-insensitively and both ending in ``/``, starts with it.

The same-endpoint rule: when several matching routes name one endpoint, the message goes there once, at the
highest priority (lowest number) among them, with that route's TTL; on equal priorities the longer TTL wins
(a global TTL, ``None``, counts as longer than any set one), so no route's promise is cut short.

Text is parsed (lark, ``edgehub.routing.parser``) only where a route is given as text: the parser is imported
then, not with this module, so a hub that compiles routes parsed elsewhere (``Router(..., trees=...)``, the
trees from ``edgehub.routing.wire``) never loads lark.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgehub.core import DEFAULT_PRIORITY, Message, RouteResult
from edgehub.core.endpoints import UPSTREAM_ENDPOINT, parse_device_endpoint, parse_module_endpoint
from edgehub.routing import ast
from edgehub.routing.compiler import CompiledExpr, EvalContext, Tri, compile_expr, to_tri
from edgehub.routing.errors import Problem, RouteCompileError, RouteError

__all__ = [
    "CompiledRoute",
    "Condition",
    "Route",
    "RouteSpec",
    "RouteVerdict",
    "Router",
    "compile_condition",
    "normalise_source",
    "parse_route",
]

log = logging.getLogger(__name__)

MAX_TTL_SECS = 4_294_967_295
_SOURCE_CACHE_SIZE = 4096


class Condition:
    """A compiled condition: call it with a message to get its ``Tri`` verdict."""

    __slots__ = ("_fn", "text")

    def __init__(self, text: str, compiled: CompiledExpr) -> None:
        self.text = text
        self._fn = compiled.fn

    def __call__(self, message: Message) -> Tri:
        return to_tri(self._fn(EvalContext(message)))

    def evaluate(self, ctx: EvalContext) -> Any:
        """The raw value (True, False, None, UNDEF or another value) against a shared context."""
        return self._fn(ctx)

    def __repr__(self) -> str:
        return f"Condition({self.text!r})"


def compile_condition(text: str, *, source: str | None = None) -> Condition:
    """Parse, type-check and compile a condition. ``source``: the route's source, for twin_change_includes.

    Raises RouteSyntaxError or RouteCompileError (both RouteError) listing every problem.
    """
    from edgehub.routing.parser import parse_condition_ast  # lark: only where text is parsed (module docstring)

    node = parse_condition_ast(text)
    compiled, problems = compile_expr(node, source=source)
    if problems:
        raise RouteCompileError(text, problems)
    return Condition(text, compiled)


@dataclass(frozen=True, slots=True)
class Route:
    """A parsed route: its source, its condition's text (``"true"`` without WHERE) and its sink, as written."""

    source: str
    condition: str
    sink: str
    endpoint: str
    text: str


def normalise_source(source: str) -> str:
    """The prefix a message source (lower-cased, with a trailing '/') must start with."""
    s = source.strip()
    if s.endswith("*"):
        s = s[:-1]
    if s.endswith("/"):
        s = s[:-1]
    return s.lower() + "/"


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _endpoint(text: str, sink: ast.SystemSink | ast.FunctionSink, problems: list[Problem]) -> str:
    span = sink.span
    if isinstance(sink, ast.SystemSink):
        if sink.name.lower() == UPSTREAM_ENDPOINT:
            return UPSTREAM_ENDPOINT
        problems.append(
            Problem(span.line, span.column, f"unknown sink {sink.name!r}: expected {UPSTREAM_ENDPOINT}", span.length)
        )
        return sink.name
    if sink.function.lower() != "brokeredendpoint":
        problems.append(
            Problem(
                span.line,
                span.column,
                f"unknown sink function {sink.function!r}: expected BrokeredEndpoint",
                span.length,
            )
        )
    elif (
        parse_module_endpoint(sink.argument) is None and parse_device_endpoint(sink.argument) is None
    ) or not _is_unicode(sink.argument):
        # A \uD800 escape gives a lone surrogate: a module and input that no UTF-8 store or topic can name.
        problems.append(
            Problem(
                span.line,
                span.column,
                'BrokeredEndpoint needs "/modules/{module}/inputs/{input}" or '
                f'"/devices/{{device}}/messages/devicebound", not {sink.argument!r}',
                span.length,
            )
        )
    return sink.argument


def _compile_route(text: str, tree: ast.RouteAst | None = None) -> tuple[Route, CompiledExpr | None]:
    """``text`` compiled, from ``tree`` when it is given (parsed elsewhere: ``edgehub.routing.wire``)."""
    if tree is None:
        from edgehub.routing.parser import parse_route_ast  # lark: only where text is parsed (module docstring)

        tree = parse_route_ast(text)
    problems: list[Problem] = []
    compiled = None
    if tree.condition is not None:
        compiled, problems = compile_expr(tree.condition, source=normalise_source(tree.source))
    endpoint = _endpoint(text, tree.sink, problems)
    if problems:
        problems.sort(key=lambda p: (p.line, p.column))
        raise RouteCompileError(text, problems)
    sink_text = (
        tree.sink.name if isinstance(tree.sink, ast.SystemSink) else f'{tree.sink.function}("{tree.sink.argument}")'
    )
    # A route with no WHERE has the condition true (docs/routes.md).
    condition_text = tree.condition_text if tree.condition_text is not None else "true"
    return Route(tree.source, condition_text, sink_text, endpoint, text), compiled


def parse_route(text: str) -> Route:
    """Parse and check a route (its condition compiled and type-checked too). Raises RouteError."""
    return _compile_route(text)[0]


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """A route with its priority (0-9, 0 highest; None: lower than 9) and TTL (None or 0: the global TTL)."""

    route: str
    priority: int | None = None
    time_to_live_secs: int | None = None

    def __post_init__(self) -> None:
        if self.priority is not None and not (0 <= self.priority <= 9):
            raise ValueError(f"priority must be 0-9, not {self.priority}")
        if self.time_to_live_secs is not None and not (0 <= self.time_to_live_secs <= MAX_TTL_SECS):
            raise ValueError(f"timeToLiveSecs must be 0..{MAX_TTL_SECS}, not {self.time_to_live_secs}")


@dataclass(frozen=True, slots=True)
class CompiledRoute:
    name: str
    route: Route
    prefix: str
    condition: Any  # Fn or None
    priority: int
    ttl_s: int | None
    result: RouteResult  # what the route gives when it matches (constant, so built once)


@dataclass(frozen=True, slots=True)
class RouteVerdict:
    """Why one route did or did not take one message (for ``edgehub routes test``)."""

    name: str
    route: Route
    source_matched: bool
    verdict: Tri | None  # None when the source did not match
    reason: str
    result: RouteResult | None


def _better(new: RouteResult, old: RouteResult) -> bool:
    if new.priority != old.priority:
        return new.priority < old.priority
    if old.ttl_s is None:
        return False
    return new.ttl_s is None or new.ttl_s > old.ttl_s


class Router:
    """Compiled routes. ``route(message)`` gives one RouteResult per endpoint the message goes to.

    ``trees``: routes already parsed (by name), compiled without parsing their text again; the others are parsed.
    """

    def __init__(
        self, routes: Mapping[str, RouteSpec | str], *, trees: Mapping[str, ast.RouteAst] | None = None
    ) -> None:
        compiled: list[CompiledRoute] = []
        errors: list[RouteError] = []
        for name, spec in routes.items():
            if isinstance(spec, str):
                spec = RouteSpec(route=spec)
            try:
                route, cond = _compile_route(spec.route, trees.get(name) if trees is not None else None)
            except RouteError as exc:
                errors.append(exc.with_route_name(name))
                continue
            if route.condition == "":
                # Accepted as Azure accepts it, but such a route never matches: say so once, at compile time.
                log.warning("route.empty_condition name=%s: the condition is undefined, the route never matches", name)
            compiled.append(
                CompiledRoute(
                    name=name,
                    route=route,
                    prefix=normalise_source(route.source),
                    condition=cond.fn if cond is not None else None,
                    priority=DEFAULT_PRIORITY if spec.priority is None else spec.priority,
                    ttl_s=spec.time_to_live_secs or None,
                    result=RouteResult(
                        endpoint=route.endpoint,
                        priority=DEFAULT_PRIORITY if spec.priority is None else spec.priority,
                        ttl_s=spec.time_to_live_secs or None,
                    ),
                )
            )
        if errors:
            first = errors[0]
            problems = [p for e in errors for p in e.problems]
            # One error for the whole set; its text shows each route's problems under that route's text.
            err = type(first)(first.text, problems[:1])
            err.problems = problems
            err.args = ("\n".join(str(e) for e in errors),)
            raise err
        self._routes = tuple(compiled)
        self.undefined_count = 0
        self.unrouted = 0  # messages no route took (Azure's "no_route" drops), counted on that branch only
        # Which routes a message source can match depends on the source alone: cached per source (sources
        # are few: one per device kind, module and output), and cleared if a flood of odd sources fills it.
        # The hot loop reads (name, condition, result) triples, not the dataclasses.
        self._by_source: dict[str, tuple[tuple[str, Any, RouteResult], ...]] = {}

    @property
    def routes(self) -> tuple[CompiledRoute, ...]:
        return self._routes

    def route(self, message: Message) -> list[RouteResult]:
        """Where ``message`` goes: one result per endpoint, in the order of the routes that chose it."""
        routes = self._by_source.get(message.source)
        if routes is None:
            source = message.source.lower() + "/"
            routes = tuple((r.name, r.condition, r.result) for r in self._routes if source.startswith(r.prefix))
            if len(self._by_source) >= _SOURCE_CACHE_SIZE:
                self._by_source.clear()
            self._by_source[message.source] = routes
        if not routes:
            self.unrouted += 1
            return []
        ctx = EvalContext(message)
        chosen: list[RouteResult] = []  # one per endpoint: routes are few, a scan is cheaper than a dict
        undefined: list[str] | None = None
        for name, condition, result in routes:
            if condition is not None:
                v = condition(ctx)
                if v is not True:
                    if v is not False and v is not None:
                        if undefined is None:
                            undefined = []
                        undefined.append(name)
                    continue
            for i, old in enumerate(chosen):
                if old.endpoint == result.endpoint:
                    if _better(result, old):
                        chosen[i] = result
                    break
            else:
                chosen.append(result)
        if undefined is not None:
            self._undefined(message, undefined)
        if chosen:
            return chosen
        self.unrouted += 1
        return []

    def _undefined(self, message: Message, names: list[str]) -> None:
        # Counted always; logged once per message, and only when debug is on (it is the common case for a route
        # whose property is missing, so a call per route would cost more than the routing).
        self.undefined_count += len(names)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("route.undefined routes=%s source=%s", ",".join(names), message.source)

    def explain(self, message: Message) -> list[RouteVerdict]:
        """Each route's verdict on ``message`` and why."""
        ctx = EvalContext(message)
        source = message.source.lower() + "/"
        out = []
        for r in self._routes:
            if not source.startswith(r.prefix):
                reason = f"source {message.source!r} is not under {r.route.source!r}"
                out.append(RouteVerdict(r.name, r.route, False, None, reason, None))
                continue
            verdict = Tri.TRUE if r.condition is None else to_tri(r.condition(ctx))
            reason = "no condition" if r.condition is None else f"condition is {verdict}"
            result = (
                RouteResult(endpoint=r.route.endpoint, priority=r.priority, ttl_s=r.ttl_s)
                if verdict is Tri.TRUE
                else None
            )
            out.append(RouteVerdict(r.name, r.route, True, verdict, reason, result))
        return out
