"""The chaos run's processes: the hub as users run it, the landing receiver, the Spark job and the lake reader.

``Processes`` starts each one in its own session (process group), copies its output line by line into
``{logs}/{name}-{n}.log`` and can wait for a line that says it is ready. ``kill_all`` SIGKILLs every group it
started that is still there (the Spark job's JVM included), and the run calls it on every way out, so a failed
or interrupted run leaves nothing behind.

``Hub`` is ``edgehub run`` on plain MQTT and plain AMQP over TCP (free ports each start; clients ask ``port``
and ``amqp_port`` where they are now), its ``$upstream`` to ``--upstream-mqtt`` through the link simulator.
``kill()`` is SIGKILL: no clean shutdown, no flush beyond what the store had made durable; ``start()`` again
opens the same data directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path

__all__ = ["EDGEHUB", "PIDS_FILE", "Hub", "Processes", "StartError", "kill_groups"]

EDGEHUB = str(Path(sys.executable).parent / "edgehub")
PIDS_FILE = "pids.txt"  # in the logs folder: every process group the run started, one leader pid a line
_TCP_PORT = re.compile(r"listening: .*\btcp 127\.0\.0\.1:(\d+)")
_AMQP_PORT = re.compile(r"\bamqp 127\.0\.0\.1:(\d+)")


class StartError(RuntimeError):
    """A process ended or stayed silent before it said it was ready; the message names its log."""


class Processes:
    """Every process of the run, each in its own process group, its output in ``logs``."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self._counts: dict[str, int] = {}
        self._running: list[asyncio.subprocess.Process] = []
        self._copiers: set[asyncio.Task[None]] = set()

    async def spawn(
        self, name: str, *argv: str, ready: re.Pattern[str] | None = None, timeout_s: float = 60.0
    ) -> tuple[asyncio.subprocess.Process, re.Match[str] | None, Path]:
        """Start ``argv``; with ``ready``, wait (at most ``timeout_s``) for an output line matching it."""
        n = self._counts[name] = self._counts.get(name, 0) + 1
        log_path = self.logs / f"{name}-{n}.log"
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._running.append(proc)
        with (self.logs / PIDS_FILE).open("a") as pids:  # for whoever must clean up after a run killed outright
            pids.write(f"{proc.pid}\n")
        matched: asyncio.Future[re.Match[str] | None] = asyncio.get_running_loop().create_future()
        copier = asyncio.create_task(self._copy(proc, log_path, ready, matched), name=f"chaos.log.{name}")
        self._copiers.add(copier)
        copier.add_done_callback(self._copiers.discard)
        if ready is None:
            return proc, None, log_path
        try:
            async with asyncio.timeout(timeout_s):
                m = await matched
        except TimeoutError:
            raise StartError(f"{name} not ready after {timeout_s} s; see {log_path}") from None
        if m is None:
            raise StartError(f"{name} ended before it was ready (exit {proc.returncode}); see {log_path}")
        return proc, m, log_path

    async def _copy(
        self,
        proc: asyncio.subprocess.Process,
        path: Path,
        ready: re.Pattern[str] | None,
        matched: asyncio.Future[re.Match[str] | None],
    ) -> None:
        assert proc.stdout is not None
        with path.open("w") as out:
            while line := await proc.stdout.readline():
                text = line.decode(errors="replace")
                out.write(text)
                out.flush()
                if ready is not None and not matched.done() and (m := ready.search(text)):
                    matched.set_result(m)
        if not matched.done():
            matched.set_result(None)

    async def wait(self, proc: asyncio.subprocess.Process, timeout_s: float) -> int:
        """The exit code, within ``timeout_s``; past it the group is killed and ``TimeoutError`` raised."""
        try:
            async with asyncio.timeout(timeout_s):
                return await proc.wait()
        except TimeoutError:
            self.kill(proc)
            await proc.wait()
            raise

    def kill(self, proc: asyncio.subprocess.Process, sig: signal.Signals = signal.SIGKILL) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)

    async def kill_all(self) -> None:
        """SIGKILL every group still running and reap it; then let the output copiers finish."""
        for proc in self._running:
            self.kill(proc)
        for proc in self._running:
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
        if self._copiers:
            await asyncio.wait(list(self._copiers), timeout=5)


def kill_groups(pids_file: Path) -> int:
    """SIGKILL each process group named in ``pids_file`` whose leader is still that group's leader (so a pid
    reused since by another process is left alone); how many there were."""
    killed = 0
    for line in pids_file.read_text().split() if pids_file.exists() else []:
        pid = int(line)
        try:
            if os.getsid(pid) != pid:
                continue
            os.killpg(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            continue
    return killed


class Hub:
    """``edgehub run`` on ``data``, restartable; ``port`` is None while it is down."""

    def __init__(self, procs: Processes, *, data: Path, manifest: Path, upstream_port: int) -> None:
        self._procs = procs
        self._argv = (
            EDGEHUB,
            "run",
            "--manifest",
            str(manifest),
            "--data-dir",
            str(data),
            "--mqtt-port",
            "0",
            "--mqtts-port",
            "0",
            "--amqps-port",
            "0",
            "--amqp-port",
            "0",
            "--admin-port",
            "0",
            "--upstream-mqtt",
            f"127.0.0.1:{upstream_port}",
            "--upstream-client-id",
            "gw",
            "--duplicate-detection",
            "--cleanup-interval",
            "1",
        )
        self._proc: asyncio.subprocess.Process | None = None
        self.port: int | None = None
        self.amqp_port: int | None = None
        self.starts = 0
        self.kills = 0

    async def start(self) -> float:
        """Start it and wait until it listens; the seconds that took."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        self._proc, m, _ = await self._procs.spawn("hub", *self._argv, ready=_TCP_PORT, timeout_s=60)
        assert m is not None
        amqp = _AMQP_PORT.search(m.string)
        if amqp is None:
            raise StartError(f"the hub listens on no plain AMQP port: {m.string.strip()}")
        self.amqp_port = int(amqp.group(1))
        self.port = int(m.group(1))
        self.starts += 1
        return loop.time() - t0

    def get_port(self) -> int | None:
        """The MQTT port now (None while down): what the clients call before each connection."""
        return self.port

    def get_amqp_port(self) -> int | None:
        return self.amqp_port

    @property
    def pid(self) -> int | None:
        """The running hub's process id; None while it is down."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def kill(self) -> None:
        """SIGKILL, as a power cut or the OOM killer would."""
        assert self._proc is not None
        self.port = self.amqp_port = None
        self._procs.kill(self._proc)
        await self._proc.wait()
        self.kills += 1

    async def stop(self) -> int:
        """SIGTERM and wait for the clean exit; its code."""
        assert self._proc is not None
        self.port = self.amqp_port = None
        self._procs.kill(self._proc, signal.SIGTERM)
        return await self._procs.wait(self._proc, 30)
