"""Dead letters, listed, requeued or purged the same way on a running hub (admin API) and on a stopped hub's
store (``edgehub deadletter``): one set of operations, ``DeadLetterAdmin``.

A dead letter is a message its endpoint refused for good or that ran out of delivery attempts
(``edgehub.store.dead_letters``). ``requeue`` puts an endpoint's dead letters back at the tail of their queues
(enqueued now, with their original TTL) and wakes the endpoint's executor on a running hub; ``purge`` deletes
them. Without an endpoint, every endpoint the store knows is meant.

Routes (bearer token): ``GET /deadletters?endpoint=E&limit=N`` (N at most ``MAX_LIST``, default 100),
``POST /deadletters/requeue?endpoint=E``, ``POST /deadletters/purge?endpoint=E``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from edgehub.runtime.admin.api import BadRequest, RouteHandler, query_int
from edgehub.runtime.admin.http import Request, Response
from edgehub.store import Store

__all__ = ["MAX_LIST", "DeadLetterAdmin", "DeadLetterError", "deadletter_routes"]

log = logging.getLogger(__name__)

MAX_LIST = 10_000
_PREVIEW_BYTES = 64  # of each dead letter's body, for a person to recognise it


class DeadLetterError(ValueError):
    """An endpoint the store does not know, or a bad limit."""


class DeadLetterAdmin:
    def __init__(self, store: Store, wake: Callable[[str], None] = lambda _: None) -> None:
        self._store = store
        self._wake = wake

    def endpoints(self, endpoint: str | None) -> list[str]:
        known = sorted({q.endpoint for q in self._store.queues()})
        if endpoint is None:
            return known
        if endpoint not in known:
            raise DeadLetterError(f"endpoint: no endpoint {endpoint!r} in the store (known: {', '.join(known)})")
        return [endpoint]

    def list(self, endpoint: str | None, limit: int = 100) -> list[dict[str, Any]]:
        if not 1 <= limit <= MAX_LIST:
            raise DeadLetterError(f"limit: 1 to {MAX_LIST}")
        out: list[dict[str, Any]] = []
        for name in self.endpoints(endpoint):
            for dl in self._store.dead_letters(name, limit - len(out)):
                body = dl.message.body
                out.append(
                    {
                        "endpoint": dl.endpoint,
                        "dlq_offset": dl.dlq_offset,
                        "priority": dl.queue.priority,
                        "offset": dl.offset,
                        "reason": dl.reason,
                        "attempts": dl.attempts,
                        "error": dl.error,
                        "dead_at_s": dl.dead_at_s,
                        "enqueued_at_s": dl.enqueued_at_s,
                        "message_id": dl.message.message_id,
                        "body_bytes": len(body),
                        "body_preview": body[:_PREVIEW_BYTES].decode("utf-8", "replace"),
                    }
                )
            if len(out) >= limit:
                break
        return out

    async def requeue(self, endpoint: str | None) -> dict[str, int]:
        done: dict[str, int] = {}
        for name in self.endpoints(endpoint):
            n = await self._store.requeue_dead_letters(name)
            if n:
                done[name] = n
                self._wake(name)
                log.info("admin.dead_letters_requeued endpoint=%s count=%d", name, n)
        return done

    async def purge(self, endpoint: str | None) -> dict[str, int]:
        done: dict[str, int] = {}
        for name in self.endpoints(endpoint):
            n = await self._store.purge_dead_letters(name)
            if n:
                done[name] = n
                log.info("admin.dead_letters_purged endpoint=%s count=%d", name, n)
        return done


def deadletter_routes(admin: DeadLetterAdmin) -> list[tuple[str, str, RouteHandler, bool]]:
    def endpoint_of(request: Request) -> str | None:
        return request.query.get("endpoint") or None

    async def listed(request: Request, params: tuple[str, ...]) -> Response:
        limit = query_int(request, "limit", default=100, low=1, high=MAX_LIST)
        try:
            return Response.json(200, {"dead_letters": admin.list(endpoint_of(request), limit)})
        except DeadLetterError as exc:
            raise BadRequest(str(exc)) from None

    async def requeued(request: Request, params: tuple[str, ...]) -> Response:
        try:
            return Response.json(200, {"requeued": await admin.requeue(endpoint_of(request))})
        except DeadLetterError as exc:
            raise BadRequest(str(exc)) from None

    async def purged(request: Request, params: tuple[str, ...]) -> Response:
        try:
            return Response.json(200, {"purged": await admin.purge(endpoint_of(request))})
        except DeadLetterError as exc:
            raise BadRequest(str(exc)) from None

    return [
        ("GET", "/deadletters", listed, False),
        ("POST", "/deadletters/requeue", requeued, False),
        ("POST", "/deadletters/purge", purged, False),
    ]
