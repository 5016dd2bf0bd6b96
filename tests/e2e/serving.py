"""The hub as ``edgehub run`` composes it, run in the test's own event loop (``serve``), and its admin API asked
until it says what a test waits for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from edgehub.runtime.admin.client import AdminClient
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.serve import serve


@asynccontextmanager
async def serving(config: HubConfig, *, timeout_s: float = 30.0) -> AsyncIterator[dict[str, int]]:
    """``serve(config)`` as a task: the ports it listens on once it is ready; stopped and awaited when the block
    ends (its failure raised then), ``timeout_s`` at most each way."""
    stop = asyncio.Event()
    ready: asyncio.Queue[dict[str, int]] = asyncio.Queue()
    task = asyncio.create_task(serve(config, stop=stop, on_ready=ready.put_nowait))
    try:
        async with asyncio.timeout(timeout_s):
            ports = await ready.get()
        yield ports
    finally:
        stop.set()
        async with asyncio.timeout(timeout_s):
            await task


async def status_until(client: AdminClient, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """``/status`` asked again until ``done(status)`` (each ask is a real round trip); bounded by the caller."""
    while True:
        _, status = await asyncio.to_thread(client.request, "GET", "/status")
        assert isinstance(status, dict)
        if done(status):
            return status
