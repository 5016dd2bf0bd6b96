"""The admin API's routes: what each request means, who may ask, and the JSON it gets back.

Routes (all JSON; every one but ``/health`` and ``/ready`` needs ``Authorization: Bearer <DATA/admin.token>``):

| method and path | does |
|---|---|
| ``GET /health`` | liveness: 200 while the process serves |
| ``GET /ready`` | readiness: 200 once the hub accepts connections, else 503 |
| ``GET /twin/reported`` | the ``$edgeHub`` reported properties (``DesiredStateService.reported``) |
| ``PUT /twin/desired`` | replace the desired properties; 200 or 400 with the ``DesiredStatus`` as JSON |
| ``PATCH /twin/desired`` | a JSON merge patch (RFC 7386) onto them; the same answer |

Further route groups (identities, status, dead letters, metrics) are added by ``AdminApi.add_routes``, each
from the module that owns its rules; a group's handlers get the request and the path's parameters.

Invariants:
* a request without the token, or with another, is refused (401) before any route runs, logged through the
  ``RefusalLog`` (``bad_credentials``); the token is compared in constant time;
* a body a route takes must be a JSON object (at most ``AdminLimits.max_body_bytes``, nesting bounded by the
  parser, every integer within Python's digit limit, no NaN or Infinity); anything else is a 400 with the reason,
  never a traceback. ``json_object`` and ``query_int`` are the only places a route reads its body or a number
  from its query, so these rules are kept once;
* the API changes the hub only through the services it is given: it holds no state of its own.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote

from edgehub.core.logtext import shown
from edgehub.core.refusals import RefusalLog, RefusalReason
from edgehub.runtime.admin.files import token_matches
from edgehub.runtime.admin.http import Request, Response

__all__ = [
    "AdminApi",
    "BadRequest",
    "DesiredStateService",
    "DesiredStatus",
    "RouteHandler",
    "json_object",
    "query_int",
    "status_json",
]

log = logging.getLogger(__name__)

RouteHandler = Callable[[Request, tuple[str, ...]], Awaitable[Response]]


class DesiredStatus(Protocol):
    """The outcome of a desired-properties update (``edgehub.runtime.deployment.controller.DesiredStatus`` is one):
    ``code`` 200 (applied) or 400 (refused, with every error and its location in ``errors``); ``version`` the
    ``$version`` it applied or was refused at (None: none given)."""

    @property
    def code(self) -> int: ...
    @property
    def description(self) -> str: ...
    @property
    def errors(self) -> tuple[str, ...]: ...
    @property
    def version(self) -> int | None: ...


class DesiredStateService(Protocol):
    """The deployment's desired and reported state (the hub's ``DeploymentController``). An update is atomic:
    applied whole or refused whole, the running configuration unchanged by a refusal."""

    def reported(self) -> dict[str, object]: ...
    async def put_desired(self, desired: dict[str, object], *, source: str) -> DesiredStatus: ...
    async def patch_desired(self, patch: dict[str, object], *, source: str) -> DesiredStatus: ...


class BadRequest(Exception):
    """A request a route refuses (400 unless said): the reason goes to the client and the refusal log."""

    def __init__(self, detail: str, *, status: int = 400, reason: RefusalReason = RefusalReason.INVALID_REQUEST):
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail


def json_object(request: Request) -> dict[str, object]:
    """The request's body as a JSON object; ``BadRequest`` for anything else (the module's invariants)."""
    try:
        value = json.loads(request.body, parse_int=_json_int, parse_constant=_json_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the body's JSON is nested too deeply") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the body must be a JSON object, not {type(value).__name__}")
    return value


def query_int(request: Request, name: str, *, default: int, low: int, high: int) -> int:
    """The query parameter ``name`` as an integer from ``low`` to ``high`` (``default`` when absent);
    ``BadRequest`` for anything else. ASCII digits only: ``str.isdigit`` also takes "²", which ``int`` refuses."""
    text = request.query.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(high))) or not low <= int(text) <= high:
        raise BadRequest(f"{name}: a number from {low} to {high}")
    return int(text)


def _json_int(text: str) -> int:
    # Python refuses to convert an integer of more digits than sys.get_int_max_str_digits() (4,300 by default)
    # with a bare ValueError, which json.loads lets through: without this it is a 500.
    try:
        return int(text)
    except ValueError:
        digits = len(text.lstrip("-"))
        limit = sys.get_int_max_str_digits()
        raise BadRequest(f"the body's JSON has an integer of {digits} digits (at most {limit} are taken)") from None


def _json_constant(name: str) -> object:
    # json.loads takes NaN and Infinity, which are not JSON: a desired property holding one would make the
    # reported properties invalid JSON for every client that reads them.
    raise BadRequest(f"the body is not JSON: {name} is not a JSON number")


def status_json(status: DesiredStatus) -> Response:
    """A ``DesiredStatus`` answered with its code (500 when it is none an HTTP client knows)."""
    code = status.code if 200 <= status.code <= 599 else 500
    return Response.json(
        code,
        {
            "code": status.code,
            "description": status.description,
            "errors": list(status.errors),
            "version": status.version,
        },
    )


@dataclass(frozen=True, slots=True)
class _Route:
    method: str
    pattern: tuple[str, ...]  # literal segments, "{}" for one parameter, "{*}" (last) for one to three
    handler: RouteHandler
    public: bool


class AdminApi:
    """The request handler of ``AdminHttpServer``: checks the token, finds the route, maps refusals."""

    def __init__(
        self,
        *,
        token: str,
        refusals: RefusalLog,
        desired: DesiredStateService | None = None,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self._token = token
        self._refusals = refusals
        self._desired = desired
        self._ready = ready
        self._routes: list[_Route] = []
        self.add_routes(
            [
                ("GET", "/health", self._health, True),
                ("GET", "/ready", self._readiness, True),
                ("GET", "/twin/reported", self._reported, False),
                ("PUT", "/twin/desired", self._put_desired, False),
                ("PATCH", "/twin/desired", self._patch_desired, False),
            ]
        )

    def add_routes(self, routes: list[tuple[str, str, RouteHandler, bool]]) -> None:
        """Add ``(method, path pattern, handler, public)`` routes; a pattern's ``{}`` segment is a parameter,
        a last ``{*}`` takes the rest of the path (one to three segments: an identity id, perhaps with an action
        after it), joined with ``/``."""
        for method, path, handler, public in routes:
            self._routes.append(_Route(method, tuple(path.strip("/").split("/")), handler, public))

    async def __call__(self, request: Request) -> Response:
        try:
            segments = tuple(unquote(s, errors="strict") for s in request.path.strip("/").split("/"))
        except UnicodeDecodeError:
            return self._refused(request, BadRequest("the path is not UTF-8", reason=RefusalReason.MALFORMED_REQUEST))
        allowed: list[str] = []
        method = (
            "GET" if request.method == "HEAD" else request.method
        )  # HEAD: GET's headers (the server drops the body)
        for route in self._routes:
            params = _match(route.pattern, segments)
            if params is None:
                continue
            if route.method != method:
                allowed.append(route.method)
                continue
            if not route.public and not self._authorized(request):
                return self._refused(
                    request,
                    BadRequest("a valid bearer token is needed", status=401, reason=RefusalReason.BAD_CREDENTIALS),
                )
            try:
                return await route.handler(request, params)
            except BadRequest as exc:
                return self._refused(request, exc)
        if allowed:
            why = BadRequest(f"{request.method} is not allowed here (allowed: {', '.join(sorted(allowed))})")
            why.status = 405
            return self._refused(request, why)
        return self._refused(
            request, BadRequest(f"no route {request.path}", status=404, reason=RefusalReason.NOT_FOUND)
        )

    def _authorized(self, request: Request) -> bool:
        return self.holds_token(request.headers.get("authorization", ""))

    def holds_token(self, authorization: str) -> bool:
        """Whether an ``Authorization`` header's value carries the admin token (the server asks it at a request's
        head, to keep the token holder's connections out of the strangers' pool)."""
        scheme, _, token = authorization.partition(" ")
        return scheme.lower() == "bearer" and token_matches(self._token, token.strip())

    def _refused(self, request: Request, exc: BadRequest) -> Response:
        self._refusals.refused(
            exc.reason,
            peer=request.peer,
            method=request.method,
            path=shown(request.path, 200),
            status=exc.status,
            detail=shown(exc.detail, 200),
        )
        extra: tuple[tuple[str, str], ...] = (("www-authenticate", "Bearer"),) if exc.status == 401 else ()
        r = Response.error(exc.status, exc.reason.value, exc.detail)
        return Response(r.status, r.body, r.content_type, extra)

    # -- the deployment ------------------------------------------------------------------------------------
    def _service(self) -> DesiredStateService:
        if self._desired is None:
            raise BadRequest("this hub takes no deployment updates through the admin API", status=503)
        return self._desired

    async def _health(self, request: Request, params: tuple[str, ...]) -> Response:
        return Response.json(200, {"status": "alive"})

    async def _readiness(self, request: Request, params: tuple[str, ...]) -> Response:
        if self._ready():
            return Response.json(200, {"status": "ready"})
        return Response.json(503, {"status": "starting"})

    async def _reported(self, request: Request, params: tuple[str, ...]) -> Response:
        return Response.json(200, self._service().reported())

    async def _put_desired(self, request: Request, params: tuple[str, ...]) -> Response:
        service = self._service()
        status = await service.put_desired(json_object(request), source=f"admin-api {request.peer}")
        return status_json(status)

    async def _patch_desired(self, request: Request, params: tuple[str, ...]) -> Response:
        service = self._service()
        status = await service.patch_desired(json_object(request), source=f"admin-api {request.peer}")
        return status_json(status)


def _match(pattern: tuple[str, ...], segments: tuple[str, ...]) -> tuple[str, ...] | None:
    params: list[str] = []
    for i, part in enumerate(pattern):
        if part == "{*}":
            rest = segments[i:]
            if not 1 <= len(rest) <= 3 or not all(rest):
                return None
            params.append("/".join(rest))
            return tuple(params)
        if i >= len(segments):
            return None
        if part == "{}":
            if not segments[i]:
                return None
            params.append(segments[i])
        elif part != segments[i]:
            return None
    return tuple(params) if len(segments) == len(pattern) else None
