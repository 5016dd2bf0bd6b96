"""A real HTTP CONNECT proxy for tests: Debian's tinyproxy (``/usr/bin/tinyproxy``), on 127.0.0.1 and a port
chosen free at start, in the foreground of a child process the peer owns.

``async with TinyproxyPeer(workdir) as proxy: proxy.port``; ``stop()`` and ``start()`` again restart it on the same
port (a proxy that went away and came back); ``basic_auth`` makes it ask for those credentials (407 without).
It allows CONNECT to any port (no ``ConnectPort`` line), since the brokers tests start are on free ports. A
missing tinyproxy fails the start (``PeerStartError``), it never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path
from types import TracebackType
from typing import Self

from edgehub.testing.peers import PeerStartError, free_port, terminate

__all__ = ["TINYPROXY_BINARY", "TinyproxyPeer"]

TINYPROXY_BINARY = "/usr/bin/tinyproxy"
_READY_S = 10.0


class TinyproxyPeer:
    """tinyproxy on 127.0.0.1 (module docstring); ``connects`` counts the CONNECTs it logged so far."""

    def __init__(self, workdir: Path, *, basic_auth: tuple[str, str] | None = None) -> None:
        self.workdir = workdir
        self.basic_auth = basic_auth
        self.host = "127.0.0.1"
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._log = workdir / "tinyproxy.log"

    def _config(self, port: int) -> str:
        lines = [
            f"Port {port}",
            f"Listen {self.host}",
            "Timeout 600",
            "MaxClients 32",
            f"Allow {self.host}",
            "LogLevel Connect",
            f'LogFile "{self._log}"',
        ]
        if self.basic_auth is not None:
            lines.append(f"BasicAuth {self.basic_auth[0]} {self.basic_auth[1]}")
        return "\n".join(lines) + "\n"

    @property
    def connects(self) -> int:
        """CONNECT requests it has logged (each an attempt through it)."""
        if not self._log.exists():
            return 0
        return self._log.read_text(errors="replace").count("Established connection to host")

    async def start(self) -> None:
        binary = shutil.which("tinyproxy") or shutil.which(TINYPROXY_BINARY)
        if binary is None:
            raise PeerStartError("tinyproxy is not installed (make apt installs it: APT_PACKAGES)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # the free port may be taken between our pick and tinyproxy's bind
            port = self.port or free_port()
            conf = self.workdir / "tinyproxy.conf"
            conf.write_text(self._config(port))
            proc = await asyncio.create_subprocess_exec(
                binary,
                "-d",
                "-c",
                str(conf),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            if await self._wait_ready(port, proc):
                self._proc, self.port = proc, port
                return
            await self._end(proc)
        raise PeerStartError(f"tinyproxy did not start; its log: {self._log.read_text(errors='replace')[-2000:]}")

    async def _wait_ready(self, port: int, proc: asyncio.subprocess.Process) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READY_S
        while loop.time() < deadline:
            if proc.returncode is not None:
                return False
            try:
                _, writer = await asyncio.open_connection(self.host, port)
            except OSError:
                await asyncio.sleep(0.05)  # polling a port another process opens: no event to wait on
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True
        return False

    async def stop(self) -> None:
        """Stop it (its open tunnels go with it); ``start()`` brings it back on the same port."""
        proc, self._proc = self._proc, None
        if proc is not None:
            await self._end(proc)

    @staticmethod
    async def _end(proc: asyncio.subprocess.Process) -> None:
        await terminate(proc)
        if proc.stderr is not None:
            with contextlib.suppress(Exception):
                await proc.stderr.read()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
