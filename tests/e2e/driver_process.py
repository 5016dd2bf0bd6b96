"""A foreign SDK's driver as the e2e tests run it: a subprocess that does one scenario and reports on stdout, one
JSON object a line, its stderr in a log the failing test shows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path


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
