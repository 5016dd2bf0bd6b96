"""The asyncio adapter of the MQTT head: the listeners, and one connection (a socket side and a session side)
and one task per client, all in the server's ``TaskGroup``.

It only moves bytes between sockets and ``ServerConnection``, runs the timers and asks the hub; the protocol lives
in ``connection.py``, a connection's socket in ``client_socket.py``, what the client is to the hub in
``session.py``, and the IoT Hub conventions in ``iothub.py``.

Invariants:
* Every client task runs in the server's ``TaskGroup`` under a name; it and the protocol callbacks catch
  everything but cancellation, so one bad client never cancels the server or another client.
* A hostile outside costs bounded memory and descriptors (each bound is an ``MqttSettings`` field): connections
  are counted from accept (``ConnectionLimiter``: pre-login caps in total and per address, a total cap under the
  descriptor limit, see ``connection_cap``), and failed logins are throttled per address and claimed client id
  (``LoginThrottle``).
* Every refusal (login, ACL, limits, protocol errors, timeouts, dropped messages) is logged through the server's
  one ``RefusalLog`` (``MqttServer.refusals``), per source address, with the client id once known.
* One live session per identity (``_clients``): a new login takes the session over; ``close_identity`` ends it
  when the identity's credentials are removed or rotated (the admin API), and a login that was checking them
  meanwhile checks them again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from types import TracebackType
from typing import Self

from edgehub.core.refusals import RefusalLog
from edgehub.hub import ConnectionLimiter, Hub, LoginThrottle
from protocol_heads.mqtt.client_socket import READ_SIZE, ClientSocket
from protocol_heads.mqtt.session import REJECT_REASONS, Session
from protocol_heads.mqtt.settings import MqttSettings, connection_cap

__all__ = ["REJECT_REASONS", "MqttServer", "MqttSettings", "connection_cap"]

log = logging.getLogger(__name__)


class MqttServer:
    """``async with MqttServer(hub, settings=...) as server:`` listens until the block ends.
    ``server.ports`` maps ``"tcp"``/``"tls"`` to the bound port numbers."""

    def __init__(self, hub: Hub, *, settings: MqttSettings) -> None:
        if settings.tls_port is not None and settings.ssl_context is None:
            raise ValueError("a TLS listener needs an ssl_context")
        self.hub = hub
        self.settings = settings
        self.ports: dict[str, int] = {}
        self._tg = asyncio.TaskGroup()
        self._servers: list[asyncio.Server] = []
        self._read_buffer = memoryview(bytearray(READ_SIZE))  # every connection reads into it (see above)
        self._clients: dict[str, Session] = {}  # identity id → its live session
        self.revocations = 0  # close_identity calls so far: a login that overlapped one checks its credentials again
        self._tasks: set[asyncio.Task[None]] = set()
        self.refusals = RefusalLog(log, clock=settings.clock)
        self.limiter = ConnectionLimiter(
            max_connections=connection_cap(settings),
            max_pending=settings.max_pending_connections,
            max_pending_per_address=settings.max_pending_per_address,
        )
        # Failed logins, per claimed client id and per source address (MqttSettings says why two).
        self.throttle = LoginThrottle(
            max_failures=settings.max_login_failures, window_s=settings.login_failure_window_s, clock=settings.clock
        )
        self.address_throttle = LoginThrottle(
            max_failures=settings.max_login_failures_per_address,
            window_s=settings.login_failure_window_s,
            clock=settings.clock,
        )

    stopping = False  # set when the server begins to stop: no more accepts, clients finishing

    async def __aenter__(self) -> Self:
        await self._tg.__aenter__()
        s = self.settings
        try:
            loop = asyncio.get_running_loop()
            if s.tcp_port is not None:
                srv = await loop.create_server(functools.partial(ClientSocket, self, None), s.host, s.tcp_port)
                self._servers.append(srv)
                self.ports["tcp"] = srv.sockets[0].getsockname()[1]
            if s.tls_port is not None:
                # Plain TCP: the handshake runs in the client's task (start_tls), counted and timed from accept.
                srv = await loop.create_server(functools.partial(ClientSocket, self, s.ssl_context), s.host, s.tls_port)
                self._servers.append(srv)
                self.ports["tls"] = srv.sockets[0].getsockname()[1]
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        log.info(
            "mqtt.listening host=%s ports=%s max_connections=%d max_pending=%d",
            s.host,
            self.ports,
            self.limiter.max_connections,
            self.limiter.max_pending,
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stopping = True  # each client's cleanup then tells an MQTT 5 client why it is closed (0x8B)
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

    def close_identity(self, identity_id: str) -> int:
        """Close the live connection of ``identity_id`` now (its credentials were removed or changed): an MQTT 5
        client gets DISCONNECT 0x98 (administrative action), and no will is published. A login of the identity
        in progress checks its credentials again before it registers. The connections closed (0 or 1)."""
        self.revocations += 1
        session = self._clients.get(identity_id)
        if session is None:
            return 0
        session.revoke()
        return 1

    def _start(self, client: ClientSocket) -> None:
        task = self._tg.create_task(self._run_client(client), name=f"mqtt.client {client.peer}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_client(self, client: ClientSocket) -> None:
        try:
            await client.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            # One bad client never takes the server down.
            log.exception("mqtt.client_crashed peer=%s", client.peer)
        finally:
            await client.cleanup()
