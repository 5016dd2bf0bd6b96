"""The asyncio adapter of the AMQP head: the listeners, and one connection (a socket side and a session side)
and one task per client, all in the server's ``TaskGroup`` (as the MQTT head's ``server``).

Invariants:
* Every client task runs in the server's ``TaskGroup`` under a name and catches everything but cancellation, so
  one bad client never cancels the server or another client.
* A hostile outside costs bounded memory and descriptors (each bound an ``AmqpSettings`` field): connections are
  counted from accept (the hub's ``ConnectionLimiter``), failed logins are throttled per address and per claimed
  identity (``LoginThrottle``), and every refusal goes through the server's one ``RefusalLog``.
* One live connection per identity (``_clients``): a new login takes over.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from types import TracebackType
from typing import Self

from edgehub.core.refusals import RefusalLog
from edgehub.hub import ConnectionLimiter, Hub, LoginThrottle
from protocol_heads.amqp.client_socket import ClientSocket
from protocol_heads.amqp.session import Session
from protocol_heads.amqp.settings import AmqpSettings, connection_cap

__all__ = ["AmqpServer", "AmqpSettings"]

log = logging.getLogger(__name__)


class AmqpServer:
    """``async with AmqpServer(hub, settings=...) as server:`` listens until the block ends.
    ``server.ports`` maps ``"amqp"``/``"amqps"`` to the bound port numbers."""

    def __init__(self, hub: Hub, *, settings: AmqpSettings) -> None:
        if settings.tls_port is not None and settings.ssl_context is None:
            raise ValueError("a TLS listener needs an ssl_context")
        self.hub = hub
        self.settings = settings
        self.ports: dict[str, int] = {}
        self._tg = asyncio.TaskGroup()
        self._servers: list[asyncio.Server] = []
        self._clients: dict[str, Session] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.refusals = RefusalLog(log, clock=settings.clock)
        self.limiter = ConnectionLimiter(
            max_connections=connection_cap(settings),
            max_pending=settings.max_pending_connections,
            max_pending_per_address=settings.max_pending_per_address,
        )
        self.throttle = LoginThrottle(
            max_failures=settings.max_login_failures, window_s=settings.login_failure_window_s, clock=settings.clock
        )
        self.address_throttle = LoginThrottle(
            max_failures=settings.max_login_failures_per_address,
            window_s=settings.login_failure_window_s,
            clock=settings.clock,
        )

    async def __aenter__(self) -> Self:
        await self._tg.__aenter__()
        s = self.settings
        try:
            loop = asyncio.get_running_loop()
            if s.tcp_port is not None:
                srv = await loop.create_server(functools.partial(ClientSocket, self, None), s.host, s.tcp_port)
                self._servers.append(srv)
                self.ports["amqp"] = srv.sockets[0].getsockname()[1]
            if s.tls_port is not None:
                srv = await loop.create_server(functools.partial(ClientSocket, self, s.ssl_context), s.host, s.tls_port)
                self._servers.append(srv)
                self.ports["amqps"] = srv.sockets[0].getsockname()[1]
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        log.info("amqp.listening host=%s ports=%s max_connections=%d", s.host, self.ports, self.limiter.max_connections)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for srv in self._servers:
            srv.close()
        for task in list(self._tasks):
            task.cancel()
        await self._tg.__aexit__(exc_type, exc, tb)
        for srv in self._servers:
            await srv.wait_closed()

    @property
    def connected(self) -> list[str]:
        """Identity ids with a live, authenticated connection."""
        return sorted(self._clients)

    def _start(self, client: ClientSocket) -> None:
        task = self._tg.create_task(self._run_client(client), name=f"amqp.client {client.peer}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_client(self, client: ClientSocket) -> None:
        try:
            await client.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("amqp.client_crashed peer=%s", client.peer)
        finally:
            await client.cleanup()
