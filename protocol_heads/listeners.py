"""What both protocol heads' servers share: the listeners, the admission and login bounds, and one task per
client in the server's ``TaskGroup`` (``HeadServer``). ``MqttServer`` and ``AmqpServer`` subclass it with their
protocol's socket side (``socket_side.SocketSide``) and session type.

Invariants:
* Every client task runs in the server's ``TaskGroup`` under a name (``{protocol}.client {peer}``); it catches
  everything but cancellation, so one bad client never cancels the server or another client.
* A hostile outside costs bounded memory and descriptors (each bound a ``HeadSettings`` field): connections are
  counted from accept (``ConnectionLimiter``: pre-login caps in total and per address, a total cap under the
  descriptor limit, see ``connection_cap``), and failed logins are throttled per source address and per (address,
  claimed identity) (``LoginThrottle``: ``logins``, which the composition root shares between the heads).
* Every refusal goes through the server's one ``RefusalLog`` (``refusals``), on the head's own logger, and every
  other line a client can cause by logging in (a login, a takeover, a will) through its ``RateLimitedLog``
  (``events``, per identity): a device that reconnects in a loop cannot fill the disk.
* One live session per identity (``claim_identity``, ``release_identity``): a new login takes the session over;
  ``close_identity`` ends it when the identity's credentials are removed or rotated (the admin API), and a login
  that was checking them meanwhile checks them again (``authenticate``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from types import TracebackType
from typing import ClassVar, Generic, Protocol, Self, TypeVar

from edgehub.core import AuthenticationError
from edgehub.core.refusals import RateLimitedLog, RefusalLog
from edgehub.hub import AuthResult, ConnectionLimiter, Credentials, Hub, LoginThrottle
from protocol_heads.limits import HeadSettings, connection_cap

__all__ = ["ClientTask", "HeadServer", "Revocable", "login_throttle"]

_LOGIN_ATTEMPTS = 3  # authentications of one login while revocations overlap it (admin actions: rare)


def login_throttle(settings: HeadSettings) -> LoginThrottle:
    """The login throttle ``settings`` ask for (to share between heads: pass it to each as ``logins``)."""
    return LoginThrottle(
        max_failures=settings.max_login_failures,
        max_failures_per_address=settings.max_login_failures_per_address,
        window_s=settings.login_failure_window_s,
        clock=settings.clock,
    )


class Revocable(Protocol):
    """A live session the server can end because its identity's credentials were removed or changed."""

    def revoke(self) -> None:
        """Close now, telling the client why in the protocol's words; the session leaves the hub as on any end."""
        ...


class ClientTask(Protocol):
    """What the server runs of one connection: its task's body, then its cleanup (even when cancelled)."""

    peer: str

    async def run(self) -> None: ...

    async def cleanup(self) -> None: ...


SettingsT = TypeVar("SettingsT", bound=HeadSettings)
SessionT = TypeVar("SessionT", bound=Revocable)


class HeadServer(Generic[SettingsT, SessionT]):
    """``async with Server(hub, settings=...) as server:`` listens until the block ends; ``server.ports`` maps
    ``port_names`` (plain, TLS) to the bound port numbers. A subclass names its ``protocol``, ``port_names`` and
    ``log``, and makes a connection's socket side in ``_socket``."""

    protocol: ClassVar[str]  # "mqtt", "amqp": the first word of task names and log lines
    port_names: ClassVar[tuple[str, str]]  # the keys of ``ports``: the plain listener's, the TLS one's
    log: ClassVar[logging.Logger]  # the head's server module's: its refusal and crash lines

    stopping = False  # set when the server begins to stop: no more accepts, clients finishing

    def __init__(self, hub: Hub, *, settings: SettingsT, logins: LoginThrottle | None = None) -> None:
        if settings.tls_port is not None and settings.ssl_context is None:
            raise ValueError("a TLS listener needs an ssl_context")
        self.hub = hub
        self.settings = settings
        self.ports: dict[str, int] = {}
        self._tg = asyncio.TaskGroup()
        self._servers: list[asyncio.Server] = []
        self._clients: dict[str, SessionT] = {}  # identity id → its live session
        self.revocations = 0  # close_identity calls so far: a login that overlapped one checks its credentials again
        self._tasks: set[asyncio.Task[None]] = set()
        self.refusals = RefusalLog(self.log, clock=settings.clock)
        self.events = RateLimitedLog(self.log, clock=settings.clock)
        self.limiter = ConnectionLimiter(
            max_connections=connection_cap(settings),
            max_pending=settings.max_pending_connections,
            max_pending_per_address=settings.max_pending_per_address,
        )
        # Failed logins, per source address and per (address, claimed identity): ``logins`` when given (one
        # throttle for every head of a hub, so a guesser has no second budget on the other protocol), else this
        # head's own, from its settings.
        self.logins = logins or login_throttle(settings)

    def _socket(self, tls: ssl.SSLContext | None) -> asyncio.BaseProtocol:
        """A new connection's socket side; ``tls``: the handshake it runs in its task (None: plain TCP)."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self._tg.__aenter__()
        s = self.settings
        plain, secure = self.port_names
        try:
            loop = asyncio.get_running_loop()
            if s.tcp_port is not None:
                srv = await loop.create_server(functools.partial(self._socket, None), s.host, s.tcp_port)
                self._servers.append(srv)
                self.ports[plain] = srv.sockets[0].getsockname()[1]
            if s.tls_port is not None:
                # Plain TCP: the handshake runs in the client's task (start_tls), counted and timed from accept.
                srv = await loop.create_server(functools.partial(self._socket, s.ssl_context), s.host, s.tls_port)
                self._servers.append(srv)
                self.ports[secure] = srv.sockets[0].getsockname()[1]
        except BaseException:
            # Closed as after a clean block (no client task ran yet): the failure itself (a port taken) is raised
            # as it is, not wrapped by the TaskGroup into an ExceptionGroup a caller would have to split.
            await self.__aexit__(None, None, None)
            raise
        self.log.info(
            "%s.listening host=%s ports=%s max_connections=%d max_pending=%d",
            self.protocol,
            s.host,
            self.ports,
            self.limiter.max_connections,
            self.limiter.max_pending,
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stopping = True  # each client's cleanup may tell its client why it is closed
        for srv in self._servers:
            srv.close()
        for task in list(self._tasks):
            task.cancel()
        await self._tg.__aexit__(exc_type, exc, tb)
        for srv in self._servers:
            await srv.wait_closed()

    def claim_identity(self, identity_id: str, session: SessionT) -> SessionT | None:
        """Make ``session`` the live session of ``identity_id``; returns the session it replaces (None: none, or
        ``session`` itself), which the caller takes over. Called without an await between it and the login's
        ``authenticate`` (see there)."""
        old = self._clients.get(identity_id)
        self._clients[identity_id] = session
        return old if old is not session else None

    def release_identity(self, identity_id: str, session: SessionT) -> None:
        """``session`` has ended: it is no longer ``identity_id``'s live session (a newer one that took over
        stays)."""
        if self._clients.get(identity_id) is session:
            del self._clients[identity_id]

    @property
    def connected(self) -> list[str]:
        """Identity ids with a live, authenticated connection."""
        return sorted(self._clients)

    def close_identity(self, identity_id: str) -> int:
        """Close the live connection of ``identity_id`` now (its credentials were removed or changed; the
        session's ``revoke`` says how its client is told). A login of the identity in progress checks its
        credentials again before it registers (``authenticate``). The connections closed (0 or 1)."""
        self.revocations += 1
        session = self._clients.get(identity_id)
        if session is None:
            return 0
        session.revoke()
        return 1

    async def authenticate(self, creds: Credentials) -> AuthResult:
        """``hub.authenticate``, once more when an identity's credentials were revoked while it ran
        (``close_identity``): a login that checked a key just removed must not register after the removal closed
        the identity's connections. The caller registers the session without awaiting anything after this."""
        for _ in range(_LOGIN_ATTEMPTS):
            seen = self.revocations
            result = await self.hub.authenticate(creds)
            if self.revocations == seen:
                return result
        raise AuthenticationError(f"the credentials of {creds.identity} changed during login")

    def adopt(self, transport: asyncio.Transport) -> asyncio.BaseProtocol:
        """Serve a connection that reached the hub another way (MQTT or AMQP over a WebSocket:
        ``protocol_heads.websocket``): a socket side of this head's on ``transport``, which carries the head's bytes
        as a TCP socket would (any TLS already done, its details in ``get_extra_info``). Counted, timed and served
        as a connection accepted here. Returns the socket side (the transport's protocol from now on)."""
        protocol = self._socket(None)
        protocol.connection_made(transport)
        return protocol

    def start_client(self, client: ClientTask) -> None:
        """Run ``client`` (a connection just admitted) in its own named task of the server's ``TaskGroup``."""
        task = self._tg.create_task(self._run_client(client), name=f"{self.protocol}.client {client.peer}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_client(self, client: ClientTask) -> None:
        try:
            await client.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            # One bad client never takes the server down.
            self.log.exception("%s.client_crashed peer=%s", self.protocol, client.peer)
        finally:
            await client.cleanup()
