"""The first run as a newcomer meets it: ``edgehub run`` with no flags but a data directory serves the default
manifest, uploads ``$upstream`` to ``DATA/landing``, and prints commands that, pasted into a shell as printed,
make a device and publish a message with mosquitto_pub and with paho; both messages land."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from edgehub.runtime.cli.app import DEFAULT_MANIFEST
from tests.e2e.hub_process import start, stop
from tests.e2e.test_upload_run_e2e import landed

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]


async def help_lines(proc: asyncio.subprocess.Process) -> list[str]:
    """The lines the hub prints after ``listening:``, up to its ``$upstream:`` line."""
    assert proc.stdout is not None
    lines: list[str] = []
    async with asyncio.timeout(10):
        while not lines or not lines[-1].startswith("  $upstream:"):
            line = (await proc.stdout.readline()).decode()
            assert line, f"edgehub run ended early: {lines}"
            lines.append(line.rstrip("\n"))
    return lines


async def shell(command: str, cwd: Path) -> str:
    """``command`` run by bash exactly as printed; its output (exit status 0 asserted)."""
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", command, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    async with asyncio.timeout(30):
        out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def test_the_printed_first_run_commands_make_a_device_whose_messages_land(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, _, _ = await start(data, DEFAULT_MANIFEST)
    lines = await help_lines(proc)
    assert f"  CA file: {data / 'certs' / 'ca.pem'}" in lines
    assert f"  $upstream: lands in {data / 'landing'} (make ingest turns it into tables)" in lines
    [add] = [x.strip() for x in lines if " identity add dev1 " in x]
    await shell(add, tmp_path)  # while the hub runs: through its admin API
    assert (data / "dev1.connection").read_text().startswith("HostName=localhost;DeviceId=dev1;")
    [mosquitto] = [x.strip() for x in lines if x.strip().startswith("mosquitto_pub ")]
    [paho] = [x.strip() for x in lines if " -c 'import json, sys, paho" in x]
    await shell(mosquitto, tmp_path)
    assert (await shell(paho, tmp_path)).strip() == "published"
    segments = await landed(data / "landing", 2)
    await stop(proc)
    records = [r for rs in segments.values() for r in rs]
    assert sorted(json.loads(r.body)["temperature"] for r in records) == [21.5, 22.5]
    assert {(r.device_id, r.priority) for r in records} == {("dev1", 5)}  # the default manifest's telemetry route
