"""The route language: ``FROM <source> WHERE <condition> INTO <sink>``, compiled once into closures.

Public API (used by tools outside the package; keep it so)::

    from edgehub.routing import (compile_condition, parse_route, Router, RouteSpec, RouteResult, Tri,
                                 RouteError, RouteSyntaxError, RouteCompileError)
"""

from edgehub.core.routes import RouteResult
from edgehub.routing.compiler import Tri
from edgehub.routing.errors import RouteCompileError, RouteError, RouteSyntaxError
from edgehub.routing.router import (
    Condition,
    Route,
    Router,
    RouteSpec,
    RouteVerdict,
    compile_condition,
    parse_route,
)

__all__ = [
    "Condition",
    "Route",
    "RouteCompileError",
    "RouteError",
    "RouteResult",
    "RouteSpec",
    "RouteSyntaxError",
    "RouteVerdict",
    "Router",
    "Tri",
    "compile_condition",
    "parse_route",
]
