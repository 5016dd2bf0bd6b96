"""What routing decides for one message and one endpoint. Lives in core so that the store and the executor
can take it without importing the router (``edgehub.routing`` re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_PRIORITY", "RouteResult"]

# An omitted route priority is lower than 9 (docs/routes.md). Queues use it as their last priority.
DEFAULT_PRIORITY = 10


@dataclass(frozen=True, slots=True)
class RouteResult:
    """Send to ``endpoint`` at ``priority`` (0 highest, DEFAULT_PRIORITY when the route gave none),
    keeping it ``ttl_s`` seconds (``None``: the global time-to-live)."""

    endpoint: str
    priority: int = DEFAULT_PRIORITY
    ttl_s: int | None = None
