"""Shared fixtures. Every test is bounded in time (pytest-timeout) and warnings are errors.

``broker`` is a real Mosquitto (the peer fixture) and ``link`` the link simulator in front of it: the upstream
tests and the end-to-end upstream tests use both. A test module may define its own ``broker`` of another kind
(``tests/spark_upload/test_receiver.py`` does); pytest takes the module's."""

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
