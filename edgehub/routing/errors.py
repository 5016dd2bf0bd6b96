"""Route errors. Every one carries 1-based ``line`` and ``column`` (of its first problem) and the full list of
``problems``; ``str(err)`` shows each problem with the offending line and a caret under it."""

from __future__ import annotations

from dataclasses import dataclass

from edgehub.core import ConfigurationError

__all__ = ["Problem", "RouteCompileError", "RouteError", "RouteSyntaxError", "render_problem"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a route or condition: where (1-based) and what."""

    line: int
    column: int
    message: str
    length: int = 1
    route_name: str | None = None


def render_problem(text: str, problem: Problem) -> str:
    """``line L, column C: message`` then the source line and a caret under the problem."""
    where = f"line {problem.line}, column {problem.column}"
    if problem.route_name is not None:
        where = f"route {problem.route_name!r}, {where}"
    lines = text.splitlines() or [""]
    src = lines[problem.line - 1] if 0 < problem.line <= len(lines) else ""
    caret = " " * (problem.column - 1) + "^" * max(1, min(problem.length, max(1, len(src) - problem.column + 1)))
    return f"{where}: {problem.message}\n    {src}\n    {caret}"


class RouteError(ConfigurationError):
    """A route or condition that cannot be used. ``problems`` lists every problem found."""

    def __init__(self, text: str, problems: list[Problem]) -> None:
        if not problems:
            raise ValueError("a RouteError needs at least one problem")
        self.text = text
        self.problems = problems
        self.line = problems[0].line
        self.column = problems[0].column
        super().__init__("\n".join(render_problem(text, p) for p in problems))

    def with_route_name(self, name: str) -> RouteError:
        """The same error, its problems tagged with the route's name (for manifests)."""
        problems = [Problem(p.line, p.column, p.message, p.length, route_name=name) for p in self.problems]
        return type(self)(self.text, problems)


class RouteSyntaxError(RouteError):
    """The text does not parse: an unknown symbol, an unterminated string, a misplaced token, trailing text."""


class RouteCompileError(RouteError):
    """The text parses but is not a valid route: a type mismatch, an unknown function, a bad sink."""
