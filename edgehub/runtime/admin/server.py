"""The admin API as part of a running hub: ``serve_admin`` starts it beside the MQTT head and stops it with it.

``async with serve_admin(data_dir, port=..., hub=..., server=...) as api:`` makes (or reads) ``DATA/admin.token``,
listens on 127.0.0.1:``port`` (0: any free port), writes ``DATA/admin.port`` once it listens, and removes that
file when it stops. It serves the deployment routes when given a ``DesiredStateService`` (the composition root's
``DeploymentController``), the identity routes on the hub's own registry (closing a removed or rotated
identity's connections through every protocol head that serves: the MQTT head's and ``other_heads``, the AMQP head
when it runs), ``/status`` (with a ``RateTracker`` sampling the store every 5 s
for the in and out rates), the dead-letter routes and ``/metrics``.

The default port is 9600, the port Azure IoT Edge's hub serves its metrics on, so scrape configurations written
for it find ``/metrics`` where they expect it (on loopback: a collector on the gateway itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from edgehub.core.refusals import RefusalLog
from edgehub.hub.facade import EdgeHub
from edgehub.runtime.admin.api import AdminApi, DesiredStateService, RouteHandler
from edgehub.runtime.admin.deadletters import DeadLetterAdmin, deadletter_routes
from edgehub.runtime.admin.files import ensure_token, remove_port_file, write_port_file
from edgehub.runtime.admin.heads import LiveConnections
from edgehub.runtime.admin.http import AdminHttpServer, AdminLimits, Request, Response
from edgehub.runtime.admin.identities import IdentityAdmin, identity_routes
from edgehub.runtime.admin.status import RateTracker, status_routes
from protocol_heads.mqtt.server import MqttServer

__all__ = ["DEFAULT_ADMIN_PORT", "LiveConnections", "serve_admin"]

log = logging.getLogger(__name__)

DEFAULT_ADMIN_PORT = 9600


@contextlib.asynccontextmanager
async def serve_admin(
    data_dir: Path,
    *,
    port: int,
    hub: EdgeHub,
    server: MqttServer,
    other_heads: Sequence[LiveConnections] = (),
    desired: DesiredStateService | None = None,
    limits: AdminLimits | None = None,
) -> AsyncIterator[AdminHttpServer]:
    token = ensure_token(data_dir)
    refusals = RefusalLog(log)
    api = AdminApi(token=token, refusals=refusals, desired=desired)
    heads: tuple[LiveConnections, ...] = (server, *other_heads)

    def close_identity(identity_id: str) -> int:
        """Every head's connections of ``identity_id`` (a device may be connected over MQTT and AMQP at once)."""
        return sum(head.close_identity(identity_id) for head in heads)

    api.add_routes(identity_routes(IdentityAdmin(hub.identities, close_identity)))
    rates = RateTracker(hub.store)
    api.add_routes(status_routes(hub.store, hub, heads, rates))
    api.add_routes(deadletter_routes(DeadLetterAdmin(hub.store, functools.partial(_wake, hub))))
    api.add_routes(_metrics_route(hub, heads))
    async with AdminHttpServer(api, refusals=refusals, port=port, limits=limits, holds_token=api.holds_token) as http:
        sampler = asyncio.create_task(rates.run(), name="admin.rates")
        write_port_file(data_dir, http.port)
        try:
            yield http
        finally:
            remove_port_file(data_dir, http.port)
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler


def _metrics_route(hub: EdgeHub, heads: Sequence[LiveConnections]) -> list[tuple[str, str, RouteHandler, bool]]:
    """``/metrics``, with prometheus-client imported at the first scrape: a hub nobody scrapes does not carry it
    (measured: 0.9 MB of RSS on top of the hub's imports)."""
    loaded: list[RouteHandler] = []

    async def metrics(request: Request, params: tuple[str, ...]) -> Response:
        if not loaded:
            from edgehub.runtime.admin.metrics import metrics_routes

            loaded.append(metrics_routes(hub, heads)[0][2])
        return await loaded[0](request, params)

    return [("GET", "/metrics", metrics, False)]


def _wake(hub: EdgeHub, endpoint: str) -> None:
    """Requeued dead letters: the endpoint's executor reads again."""
    executor = hub.executors.get(endpoint)
    if executor is not None:
        executor.notify()
