"""``edgehub run``'s limit flags as an operator gives them: ``--max-token-lifetime`` refuses a token expiring
further ahead (and takes one within), ``--store-quota`` with ``--identity-share`` answers a device past its share
with PUBACK 0x97 while another device is accepted; a malformed flag is refused before serving."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from click.testing import CliRunner

from edgehub.core.sas import ConnectionString
from edgehub.runtime.cli import main
from edgehub.runtime.cli.limits import parse_lifetime_s, parse_share, parse_store_quota
from tests.e2e.hub_process import identity_add, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

ROUTES = {"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}


async def connect(port: int, ca: Path, cs: ConnectionString, expiry_s: int) -> tuple[Paho, int]:
    client = Paho.make(cs.identity.id, protocol=mqtt.MQTTv5)
    user = f"{cs.host_name}/{cs.identity.id}/?api-version=2021-04-12"
    rc = await client.connect(port, tls_ca=ca, user=user, password=cs.sas_token(expiry_s))
    return client, int(rc.value)


async def publish_codes(client: Paho, topic: str, count: int, size: int) -> list[int]:
    mids = [client.publish(topic, b"x" * size) for _ in range(count)]
    codes: dict[int, int] = {}
    async with asyncio.timeout(20):
        while len(codes) < count:
            mid, rc = await client.publishes.get()
            codes[mid] = rc
    return [codes[m] for m in mids]


async def test_edgehub_run_enforces_its_token_lifetime_and_identity_share_flags(tmp_path: Path) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(ROUTES))
    noisy_cs = await identity_add(data, "noisy")
    quiet_cs = await identity_add(data, "quiet")
    # --no-upstream: the messages stay in the store, so the quota fills (the default would upload them)
    flags = ("--max-token-lifetime", "1h", "--store-quota", "40000", "--identity-share", "25%", "--no-upstream")
    proc, port, _ = await start(data, manifest, *flags)
    ca = data / "certs" / "ca.pem"
    now = int(time.time())
    try:
        far, rc = await connect(port, ca, noisy_cs, now + 7200)
        assert rc in (0x86, 0x87)  # bad credentials / not authorized: the token outlives the one-hour limit
        await far.close()
        noisy, rc = await connect(port, ca, noisy_cs, now + 1800)
        assert rc == 0
        codes = await publish_codes(noisy, "devices/noisy/messages/events/", 12, 1000)
        assert codes[:9] == [0] * 9  # ~1,050 charged bytes each; the share is 10,000
        assert set(codes[9:]) == {0x97}
        await noisy.close()
        quiet, rc = await connect(port, ca, quiet_cs, now + 1800)
        assert rc == 0
        assert await publish_codes(quiet, "devices/quiet/messages/events/", 2, 1000) == [0, 0]
        await quiet.close()
    finally:
        assert (await stop(proc)).rstrip().endswith("stopped")


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-token-lifetime", "soon"), ("--store-quota", "lots"), ("--identity-share", "150%")],
)
def test_edgehub_run_refuses_a_malformed_limit_before_serving(tmp_path: Path, flag: str, value: str) -> None:
    result = CliRunner().invoke(main, ["run", "--data-dir", str(tmp_path / "d"), flag, value])
    assert result.exit_code == 2
    assert flag in result.output
    assert not (tmp_path / "d").exists()


def test_limit_flags_parse_durations_sizes_and_shares() -> None:
    assert parse_lifetime_s("365d") == 365 * 86_400
    assert parse_lifetime_s("90m") == 5400
    assert parse_lifetime_s("none") is None
    assert parse_store_quota("2GiB") == 2 << 30
    assert parse_store_quota("auto") == "auto"
    assert parse_store_quota("0") is None
    assert parse_share("25%") == 0.25
    assert parse_share("0.5") == 0.5
    assert parse_share("none") is None
