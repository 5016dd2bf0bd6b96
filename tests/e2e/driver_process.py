"""A foreign SDK's driver as the e2e tests run it: a subprocess that does one scenario and reports on stdout, one
JSON object a line, its stderr in a log the failing test shows."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest


@asynccontextmanager
async def driver_process(
    argv: list[str], stderr: Path, env: Mapping[str, str]
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``argv`` with ``env``, its stdout a pipe and its stderr written to ``stderr``; killed if the block leaves it
    running."""
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=err, env=dict(env))
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@dataclass
class DriverRun:
    """One driver process and its stderr log; each step it takes ``STEP_S`` at most."""

    STEP_S: ClassVar[float] = 30.0  # the longest any one SDK step (start, connect, send, receive) may take
    WHO: ClassVar[str] = "the SDK driver"  # as the failures name it

    proc: asyncio.subprocess.Process
    stderr: Path

    async def next_event(self) -> dict[str, Any]:
        """The driver's next JSON line; the test fails, showing its stderr, if none comes within ``STEP_S`` or the
        driver ends first."""
        assert self.proc.stdout is not None
        line = None
        try:
            async with asyncio.timeout(self.STEP_S):
                line = await self.proc.stdout.readline()
        except TimeoutError:
            pass
        if line is None:
            pytest.fail(f"no word from {self.WHO} in {self.STEP_S} s; its stderr:\n{await self.said()}")
        if not line:
            await self.proc.wait()
            pytest.fail(f"{self.WHO} ended (exit {self.proc.returncode}) early; its stderr:\n{await self.said()}")
        event: dict[str, Any] = json.loads(line)
        return event

    async def said(self) -> str:
        """What the driver wrote to its stderr so far."""
        return await asyncio.to_thread(self.stderr.read_text)

    async def exit_code(self) -> int:
        async with asyncio.timeout(self.STEP_S):
            return await self.proc.wait()
