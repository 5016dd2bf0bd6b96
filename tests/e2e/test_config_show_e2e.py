"""``edgehub config show`` beside an ``edgehub run`` given the same flags: the settings it shows are the ones the
running hub serves with (here the upstream's lanes, read back from the running hub's admin API), and showing them
leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from edgehub.runtime.admin.client import running_hub
from tests.e2e.hub_process import EDGEHUB, start, stop

pytestmark = [pytest.mark.timeout(90)]


def config_show(*args: str) -> dict[str, tuple[str, str]]:
    done = subprocess.run([EDGEHUB, "config", "show", *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    rows: dict[str, tuple[str, str]] = {}
    for line in done.stdout.splitlines():
        name, rest = line.split(maxsplit=1)
        value, source = rest.rsplit(maxsplit=1)
        rows[name] = (value.strip(), source)
    return rows


async def test_config_show_shows_the_lanes_and_ttl_a_hub_started_with_the_same_flags_runs_with(tmp_path: Path) -> None:
    manifest, data = tmp_path / "m.json", tmp_path / "data"
    desired = {
        "schemaVersion": "1.1",
        "routes": {"up": "FROM /messages/* INTO $upstream"},
        "storeAndForwardConfiguration": {"timeToLiveSecs": 3600},
        "upstream": {"partitions": 2},
    }
    manifest.write_text(json.dumps(desired))
    flags = ("--upstream-partitions", "3", "--upstream-upload", (tmp_path / "landing").as_uri())
    common = ("--manifest", str(manifest), "--data-dir", str(data), "--mqtts-port", "0", "--amqps-port", "0")

    rows = await asyncio.to_thread(config_show, *common, *flags)

    assert not data.exists()  # showing starts nothing and writes nothing
    assert rows["upstream.partitions"] == ("3", "flag")
    assert rows["store.default_ttl_s"] == ("3600", "manifest")
    assert rows["mqtts_port"] == ("0", "flag")

    proc, _, lines = await start(data, manifest, *flags)
    try:
        assert "upstream: partitions=3 duplicate detection off" in lines
        client = await asyncio.to_thread(running_hub, data)
        assert client is not None
        _, status = await asyncio.to_thread(client.request, "GET", "/status")
        assert isinstance(status, dict)
        lanes: list[dict[str, Any]] = status["upstream"]
        assert len(lanes) == int(rows["upstream.partitions"][0])
    finally:
        await stop(proc)
