"""``edgehub`` as users run it: a subprocess of the installed console script, its start-up lines read until it
listens, SIGTERM to stop it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path

from edgehub.core.sas import ConnectionString

EDGEHUB = str(Path(sys.executable).parent / "edgehub")

# Every hub ``start`` launched, so that one a failing test never stopped is killed after it (``kill_leftovers``,
# an autouse fixture in conftest.py): a leftover hub keeps its port, its store and a core's share.
_started: list[int] = []


def kill_leftovers() -> None:
    """SIGKILL every hub ``start`` launched that is still running (the pid still an ``edgehub run``)."""
    while _started:
        pid = _started.pop()
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone (or no /proc): nothing to do
        if b"edgehub" in cmdline and b"run" in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def identity_add(data: Path, *args: str) -> ConnectionString:
    """``edgehub identity add ARGS --data-dir DATA``; its printed connection string."""
    proc = await asyncio.create_subprocess_exec(
        EDGEHUB, "identity", "add", *args, "--data-dir", str(data), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    return ConnectionString.parse(out.decode().strip())


async def start(
    data: Path, manifest: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[asyncio.subprocess.Process, int, list[str]]:
    """``edgehub run`` with TLS on a free port (``env`` added to the environment); the process, that port and the
    lines it printed until ready."""
    proc = await asyncio.create_subprocess_exec(
        EDGEHUB,
        "run",
        "--manifest",
        str(manifest),
        "--data-dir",
        str(data),
        "--mqtts-port",
        "0",
        "--amqps-port",
        "0",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    _started.append(proc.pid)
    assert proc.stdout is not None
    lines: list[str] = []
    async with asyncio.timeout(30):
        while True:
            line = (await proc.stdout.readline()).decode()
            assert line, f"edgehub run ended early: {lines}"
            lines.append(line.rstrip("\n"))
            m = re.search(r"listening: tls 127\.0\.0\.1:(\d+)", line)
            if m:
                return proc, int(m.group(1)), lines


async def stop(proc: asyncio.subprocess.Process) -> str:
    """SIGTERM, then wait for a clean exit; what it printed after start-up."""
    proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        out, _ = await proc.communicate()
    assert proc.returncode == 0
    return out.decode()
