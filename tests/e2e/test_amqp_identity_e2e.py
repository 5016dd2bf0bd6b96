"""``edgehub identity rotate-key`` and ``remove`` against ``edgehub run`` close the identity's AMQP connections as
they close its MQTT ones (the admin API asks every head that serves): the device's connection is closed with
``amqp:unauthorized-access``, it logs in again with the new key, and after removal it is closed again. While it is
connected, ``edgehub status`` counts it among the connected clients."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from proton import ConnectionException
from proton.utils import ConnectionClosed

from edgehub.core.sas import ConnectionString
from tests.e2e.hub_process import EDGEHUB, identity_add, start, stop
from tests.e2e.test_amqp_e2e import amqp_client, amqps_port
from tests.protocol_heads.amqp.conftest import ProtonClient

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

MANIFEST = {"schemaVersion": "1.1", "routes": {"all": "FROM /messages/* INTO BrokeredEndpoint('/modules/f/inputs/in')"}}


async def edgehub(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        EDGEHUB, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def closed_by_hub(client: ProtonClient) -> str | None:
    """Wait until the hub closes ``client``'s connection; the condition it gave."""
    try:
        with pytest.raises(ConnectionClosed) as closed:
            await client.pump_until(lambda: False)
    finally:
        await client.close()
    condition: str | None = closed.value.condition
    return condition


async def test_rotating_or_removing_an_identity_closes_its_amqp_connection(tmp_path: Path) -> None:
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    manifest.write_text(json.dumps(MANIFEST))
    proc, _, lines = await start(data, manifest)
    port = amqps_port(lines)
    try:
        cs = await identity_add(data, "amqpdev")  # through the running hub's admin API
        client = await amqp_client(port, data, cs)
        await client.sender("/devices/amqpdev/messages/events")  # logged in and serving
        # /status (and /metrics' edgehub_connected_clients) count the AMQP head's sessions too.
        status = json.loads(await edgehub("status", "--json", "--data-dir", str(data)))
        assert status["connected_clients"] == 1

        out = await edgehub("identity", "rotate-key", "amqpdev", "--data-dir", str(data))
        rotated = ConnectionString.parse(out.strip())
        assert rotated.shared_access_key != cs.shared_access_key
        assert await closed_by_hub(client) == "amqp:unauthorized-access"

        with pytest.raises(ConnectionException):  # the old key no longer logs in
            await amqp_client(port, data, cs)
        client = await amqp_client(port, data, rotated)
        await client.sender("/devices/amqpdev/messages/events")

        out = await edgehub("identity", "remove", "amqpdev", "--data-dir", str(data))
        assert "connections closed: 1" in out
        assert await closed_by_hub(client) == "amqp:unauthorized-access"
    finally:
        await stop(proc)
