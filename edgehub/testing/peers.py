"""Foreign peers for tests and benchmarks, started one way whatever the machine: a Mosquitto broker.

``MosquittoPeer`` writes a ``mosquitto.conf`` under a work directory and starts the broker

* in a container through **testcontainers** (``eclipse-mosquitto:2``) when a Docker engine answers, or
* from the Debian package's binary (``/usr/sbin/mosquitto``) when none does.

Both paths are real code; ``how`` says which one ran. Either way the broker listens on 127.0.0.1 only, on a
port chosen free at start (Mosquitto cannot bind port 0 itself, so a free port is picked and the bind retried
if another process took it first), and ``start()`` returns only once the broker answers an MQTT CONNECT with
a CONNACK, so a test never races the broker's start-up.

``extra_config`` lines are appended verbatim after the listener, so listener options (``cafile``, ``certfile``,
``require_certificate``) apply to it; also a bridge to another broker, a ``password_file``, limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ["MOSQUITTO_BINARY", "MOSQUITTO_IMAGE", "MosquittoPeer", "PeerStartError", "PeerWay", "docker_engine_answers"]

log = logging.getLogger(__name__)

MOSQUITTO_BINARY = "/usr/sbin/mosquitto"
MOSQUITTO_IMAGE = "eclipse-mosquitto:2"
_CONTAINER_PORT = 1883
# A minimal MQTT 3.1.1 CONNECT (clean session, keepalive 60 s, empty client id) and the CONNACK accepting it.
_PROBE_CONNECT = bytes([0x10, 12, 0, 4]) + b"MQTT" + bytes([4, 0x02, 0, 60, 0, 0])
_CONNACK_OK = bytes([0x20, 2, 0, 0])


class PeerStartError(RuntimeError):
    """The peer did not come up; the message carries its output."""


class PeerWay(StrEnum):
    CONTAINER = "container"
    BINARY = "binary"


def docker_engine_answers(timeout_s: float = 2.0) -> bool:
    """True when a Docker engine answers ``GET /_ping`` at ``DOCKER_HOST`` (default: the local socket).

    Asked over a raw socket rather than through the docker SDK, which leaves sockets behind when no engine
    is there (and warnings are errors in our tests).
    """
    docker_host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if docker_host.startswith("unix://"):
            path = docker_host.removeprefix("unix://")
            if not os.path.exists(path):
                return False
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout_s)
            address: Any = path
        elif docker_host.startswith("tcp://"):
            host, _, port = docker_host.removeprefix("tcp://").rstrip("/").rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(timeout_s)
            address = (host, int(port))
        else:
            return False
        with sock:
            sock.connect(address)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = sock.recv(4096)
        return reply.startswith(b"HTTP/1.") and b" 200 " in reply.split(b"\r\n", 1)[0]
    except (OSError, ValueError):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


async def terminate(proc: asyncio.subprocess.Process, grace_s: float = 5.0) -> None:
    """SIGTERM a peer's process if it still runs; SIGKILL it if it has not ended within ``grace_s``."""
    if proc.returncode is None:
        proc.terminate()
        try:
            async with asyncio.timeout(grace_s):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _mqtt_answers(host: str, port: int) -> bool:
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    try:
        writer.write(_PROBE_CONNECT)
        async with asyncio.timeout(2):
            # Any CONNACK will do: a broker that refuses anonymous clients still answers.
            return (await reader.readexactly(4))[:2] == _CONNACK_OK[:2]
    except (OSError, asyncio.IncompleteReadError, TimeoutError):
        return False
    finally:
        writer.close()


class MosquittoPeer:
    """A Mosquitto broker on 127.0.0.1. ``async with MosquittoPeer(tmp_path) as broker: broker.port``."""

    def __init__(
        self,
        workdir: Path,
        *,
        persistence: bool = False,
        allow_anonymous: bool = True,
        extra_config: Sequence[str] = (),
        way: PeerWay | None = None,
        start_timeout_s: float = 20.0,
        name: str = "mosquitto",
    ) -> None:
        """``way=None`` picks the container when a Docker engine answers, else the binary."""
        self.workdir = workdir / name
        self.persistence = persistence
        self.allow_anonymous = allow_anonymous
        self.extra_config = tuple(extra_config)
        self._way = way
        self.start_timeout_s = start_timeout_s
        self.host = "127.0.0.1"
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._container: Any = None

    @property
    def how(self) -> PeerWay:
        if self._way is None:
            raise RuntimeError("peer not started")
        return self._way

    def _config(self, port: int, *, in_container: bool) -> str:
        data = "/mosquitto/data/" if in_container else f"{self.workdir / 'data'}/"
        lines = [
            f"listener {port}" if in_container else f"listener {port} 127.0.0.1",
            f"allow_anonymous {'true' if self.allow_anonymous else 'false'}",
            f"persistence {'true' if self.persistence else 'false'}",
            f"persistence_location {data}",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
            *self.extra_config,
        ]
        if not in_container and os.geteuid() == 0:
            # As root, Mosquitto drops to the 'mosquitto' user, which cannot write a root-owned tmp dir.
            lines.append("user root")
        return "\n".join(lines) + "\n"

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "data").mkdir(exist_ok=True)
        if self._way is None:
            self._way = PeerWay.CONTAINER if await asyncio.to_thread(docker_engine_answers) else PeerWay.BINARY
        if self._way is PeerWay.CONTAINER:
            await self._start_container()
        else:
            await self._start_binary()
        log.info("peer.started kind=mosquitto way=%s port=%d", self._way, self.port)

    async def _start_binary(self) -> None:
        if shutil.which(MOSQUITTO_BINARY) is None:
            raise PeerStartError(f"{MOSQUITTO_BINARY} not found: apt-get install mosquitto")
        last_err = ""
        for _ in range(3):  # the free port may be taken between our pick and Mosquitto's bind
            port = free_port()
            conf = self.workdir / "mosquitto.conf"
            conf.write_text(self._config(port, in_container=False))
            logfile = self.workdir / "mosquitto.log"
            with logfile.open("wb") as err:  # a file, not a pipe: nobody reads a long-running broker's stderr
                proc = await asyncio.create_subprocess_exec(
                    MOSQUITTO_BINARY, "-c", str(conf), stdout=asyncio.subprocess.DEVNULL, stderr=err
                )
            if await self._wait_ready(port, proc):
                self._proc, self.port = proc, port
                return
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            last_err = logfile.read_text(errors="replace")
        raise PeerStartError(f"mosquitto did not start: {last_err.strip()}")

    async def _wait_ready(self, port: int, proc: asyncio.subprocess.Process | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        delay = 0.02
        while loop.time() < deadline:
            if proc is not None and proc.returncode is not None:
                return False
            if await _mqtt_answers(self.host, port):
                return True
            await asyncio.sleep(delay)  # polling a foreign process that offers no readiness signal
            delay = min(delay * 2, 0.5)
        return False

    async def _start_container(self) -> None:
        from testcontainers.core.container import DockerContainer

        host_port = free_port()
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(self._config(_CONTAINER_PORT, in_container=True))
        container = (
            DockerContainer(MOSQUITTO_IMAGE)
            .with_volume_mapping(str(conf), "/mosquitto/config/mosquitto.conf", "ro")
            .with_bind_ports(_CONTAINER_PORT, host_port)
        )
        # Publish on loopback only: the Docker SDK takes (address, port) for a host binding, which
        # with_bind_ports' signature does not admit.
        ports: dict[str, Any] = container.ports
        ports[str(_CONTAINER_PORT)] = (self.host, host_port)
        await asyncio.to_thread(container.start)
        self._container = container
        self.port = host_port
        if not await self._wait_ready(host_port, None):
            logs = await asyncio.to_thread(container.get_logs)
            await self.stop()
            raise PeerStartError(f"mosquitto container did not answer: {logs!r}")

    async def stop(self) -> None:
        if self._proc is not None:
            proc, self._proc = self._proc, None
            await terminate(proc)
        if self._container is not None:
            container, self._container = self._container, None
            await asyncio.to_thread(container.stop)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
