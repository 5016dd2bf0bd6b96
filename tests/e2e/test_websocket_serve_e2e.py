"""The WebSocket listener as the composition root serves it (``serve`` with ``HubConfig.ws_port``/``wss_port``):
the default TLS port (``wss_port_optional``, 443 on the command line) is served where the hub may bind it and
otherwise off with one line, while a port asked for explicitly must bind or the start fails. The port "not
available" here is one this test holds, never 443 itself (a user's hub may hold that)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgehub.core import Identity
from edgehub.runtime.cli.serving import start_failures
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.serve import serve
from edgehub.runtime.compose.store import open_identities, open_store
from tests.e2e.serving import serving
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that this test holds (listening), so the hub cannot bind it."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


async def hub_config(tmp_path: Path, **ports: object) -> HubConfig:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {}}))
    store = open_store(data)
    await open_identities(store, "localhost", data_dir=data).set_password(Identity.parse("dev1"), b"pw")
    await store.close()
    return HubConfig(manifest=manifest, data_dir=data, mqtts_port=None, **ports)  # type: ignore[arg-type]


async def test_the_default_wss_port_not_available_is_off_with_one_line_and_ws_still_serves(
    tmp_path: Path, taken_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "edgehub.runtime.compose.serve")
    config = await hub_config(tmp_path, ws_port=0, wss_port=taken_port, wss_port_optional=True)
    async with serving(config) as ports:
        assert "wss" not in ports
        device = Paho.make("dev1", websocket_path="/$iothub/websocket")
        assert await device.connect(ports["ws"], user="dev1", password="pw") == 0  # the MQTT head, over ws://
        await device.close()
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ws.wss_off")]
    assert f"port={taken_port}" in line


async def test_a_wss_port_asked_for_that_cannot_be_bound_stops_the_start(tmp_path: Path, taken_port: int) -> None:
    config = await hub_config(tmp_path, wss_port=taken_port, wss_port_optional=False)
    with pytest.raises(Exception) as failed:  # the hub's task groups may wrap it: checked below
        async with asyncio.timeout(30):
            await serve(config, stop=asyncio.Event())
    # what edgehub run tells the user, from the failure as it comes (wrapped or not)
    said = start_failures(failed.value)
    assert said is not None
    assert any("address already in use" in line and str(taken_port) in line for line in said)
