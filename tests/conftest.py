"""Shared fixtures. Every test is bounded in time (pytest-timeout) and warnings are errors.

``broker`` is a real Mosquitto (the peer fixture) and ``link`` the link simulator in front of it: the upstream
tests and the end-to-end upstream tests use both. A test module may define its own ``broker`` of another kind
(``tests/spark_upload/test_receiver.py`` does); pytest takes the module's.

``edgehub run`` serves on uvloop (``--event-loop``), the tests in process on asyncio's loop; the MQTT head's
interop tests and the in-process hub end-to-end tests run on both (``pytest_asyncio_loop_factories``).

Hypothesis profiles: ``edgehub`` (the default: no deadline, since a loaded 2-core box makes any example slow
now and then) and ``fuzz`` (100 times the examples, for a long run: ``HYPOTHESIS_PROFILE=fuzz pytest
tests/fuzz``); tests/fuzz/budget.py scales each fuzz target's examples by the profile's."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import pytest
import uvloop
from hypothesis import settings

from edgehub.testing.linksim import LinkSim
from edgehub.testing.peers import MosquittoPeer

# Every `edgehub run` a test starts puts its admin API on a free port (DATA/admin.port says which), not on the
# fixed default 9600: hubs of tests running side by side must not fight over one port.
os.environ.setdefault("EDGEHUB_ADMIN_PORT", "0")
# Likewise their WebSocket listener with TLS: a free port, never 443 (a user's hub, or another test's, may hold it).
os.environ.setdefault("EDGEHUB_WSS_PORT", "0")

settings.register_profile("edgehub", deadline=None)
settings.register_profile("fuzz", deadline=None, max_examples=10_000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "edgehub"))

# Test modules whose async tests run once on each event loop edgehub can serve on.
ON_BOTH_LOOPS = {
    "test_server_interop.py",
    "test_hub_e2e.py",
    "test_hostile.py",
    "test_garbage_clients.py",
    "test_websocket.py",  # the WebSocket listener hands sockets over (set_protocol): edgehub run serves on uvloop
    "test_mqtt_websocket_proxy.py",  # the upstream hands its socket over too (proxy, TLS, WebSocket)
    "test_stream.py",
    "test_mqtt_client_wire.py",  # the upstream client: edgehub run serves on uvloop
}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.path.name in ON_BOTH_LOOPS:
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[MosquittoPeer]:
    async with MosquittoPeer(tmp_path) as peer:
        yield peer


@pytest.fixture
async def link(broker: MosquittoPeer) -> AsyncIterator[LinkSim]:
    async with LinkSim(target_host=broker.host, target_port=broker.port) as sim:
        yield sim
