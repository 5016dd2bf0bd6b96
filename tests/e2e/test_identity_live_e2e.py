"""``edgehub identity`` (and ``status``) against ``edgehub run`` as processes: an identity added while
the hub runs connects within a second; one removed is disconnected within a second; the same commands work on
the data directory once the hub has stopped."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from tests.e2e.hub_process import EDGEHUB, identity_add, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

MANIFEST = {"schemaVersion": "1.1", "routes": {"all": "FROM /messages/* INTO BrokeredEndpoint('/modules/f/inputs/in')"}}


async def edgehub(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        EDGEHUB, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_identities_added_and_removed_while_the_hub_runs_take_effect_within_a_second(tmp_path: Path) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(MANIFEST))
    proc, port, _ = await start(data, manifest)
    ca = data / "certs" / "ca.pem"
    try:
        assert (data / "admin.port").exists()
        cs = await identity_add(data, "live1")  # the hub holds the store: this goes through its admin API
        dev = Paho.make("live1", protocol=MQTTProtocolVersion.MQTTv5)
        user = f"{cs.host_name}/live1/?api-version=2021-04-12"
        added_at = time.monotonic()
        async with asyncio.timeout(1.0):
            rc = await dev.connect(port, tls_ca=ca, user=user, password=cs.sas_token(int(time.time()) + 3600))
        assert not rc.is_failure
        print(f"connected {time.monotonic() - added_at:.3f}s after identity add returned")

        code, out, err = await edgehub("identity", "list", "--data-dir", str(data), "--json")
        assert code == 0, err
        assert {"id": "live1", "auth": ["sas"]} in json.loads(out)["identities"]
        code, out, err = await edgehub("status", "--json", "--data-dir", str(data))
        assert code == 0, err
        status = json.loads(out)
        assert status["running"] is True  # through the admin API: a stopped hub's store knows no clients
        assert status["connected_clients"] == 1

        code, out, err = await edgehub("identity", "remove", "live1", "--data-dir", str(data))
        removed_at = time.monotonic()
        assert code == 0, err
        assert "connections closed: 1" in out
        try:
            async with asyncio.timeout(1.0):
                reason = await dev.disconnects.get()
            print(f"disconnected {time.monotonic() - removed_at:.3f}s after identity remove returned")
            assert reason.value == 0x98
        finally:
            await dev.close()
        code, _, err = await edgehub("identity", "remove", "live1", "--data-dir", str(data))
        assert code == 1
        assert "no identity live1" in err
    finally:
        await stop(proc)
    assert not (data / "admin.port").exists()

    # Stopped: the same commands work on the data directory.
    await identity_add(data, "later")
    code, out, err = await edgehub("identity", "rotate-key", "later", "--data-dir", str(data))
    assert code == 0, err
    assert "SharedAccessKey=" in out
    code, out, err = await edgehub("identity", "list", "--data-dir", str(data))
    assert code == 0, err
    assert "later\tsas" in out
    assert "live1" not in out
