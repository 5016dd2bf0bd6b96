"""Real peers for upstream tests: a Mosquitto broker from the peer fixture, reached through the link simulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.testing.linksim import LinkSim
from edgehub.testing.peers import MosquittoPeer


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[MosquittoPeer]:
    async with MosquittoPeer(tmp_path) as peer:
        yield peer


@pytest.fixture
async def link(broker: MosquittoPeer) -> AsyncIterator[LinkSim]:
    async with LinkSim(target_host=broker.host, target_port=broker.port) as sim:
        yield sim
