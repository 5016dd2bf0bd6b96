"""``edgehub identity add`` and ``edgehub run`` as processes: the printed connection string logs a paho device in
over TLS with the CA the first start generated; SIGTERM stops the hub cleanly and a restart keeps the message.
The first start serves on uvloop (the default), the restart on the standard library's loop."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from edgehub.core import Identity
from tests.e2e.hub_process import identity_add, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

ROUTES = {
    "schemaVersion": "1.1",
    "routes": {"toFilter": "FROM /messages/* INTO BrokeredEndpoint('/modules/f/inputs/in')"},
}


async def test_edgehub_run_serves_tls_with_its_generated_ca_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(ROUTES))
    dev_cs = await identity_add(data, "dev1")
    mod_cs = await identity_add(data, "edge", "--module", "f")
    assert dev_cs.gateway_host_name == "localhost"
    assert mod_cs.identity == Identity.parse("edge/f")

    proc, port, lines = await start(data, manifest)
    assert lines[0].startswith("edgehub ")
    assert any("toFilter:" in line and "endpoint=/modules/f/inputs/in" in line for line in lines)
    assert any(line.startswith("created TLS certificates") for line in lines)
    assert "upstream: partitions=1 duplicate detection off" in lines
    assert "event loop: uvloop" in lines  # the default
    ca = data / "certs" / "ca.pem"
    dev = Paho.make("dev1")
    user = f"{dev_cs.host_name}/dev1/?api-version=2021-04-12"
    assert await dev.connect(port, tls_ca=ca, user=user, password=dev_cs.sas_token(int(time.time()) + 86_400)) == 0
    mid = dev.publish("devices/dev1/messages/events/$.mid=p1", b"through the process")
    async with asyncio.timeout(10):
        assert await dev.publishes.get() == (mid, 0)
    await dev.close()
    assert (await stop(proc)).rstrip().endswith("stopped")

    proc, port, lines = await start(
        data,
        manifest,
        "--upstream-partitions",
        "2",
        "--duplicate-detection",
        "--duplicate-window-secs",
        "120",
        "--event-loop",
        "asyncio",
    )
    assert "event loop: asyncio" in lines
    assert any(line.startswith("using TLS certificates") for line in lines)
    assert "upstream: partitions=2 duplicate detection on, window 120s" in lines
    mod = Paho.make("edge/f")
    user = f"{mod_cs.host_name}/edge/f/?api-version=2021-04-12"
    assert await mod.connect(port, tls_ca=ca, user=user, password=mod_cs.sas_token(int(time.time()) + 86_400)) == 0
    async with asyncio.timeout(10):
        got = await mod.messages.get()
    assert got.payload == b"through the process"
    assert got.topic.startswith("devices/edge/modules/f/inputs/in/")
    await mod.close()
    await stop(proc)
