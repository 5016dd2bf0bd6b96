"""The hub in the environment ``deployment/edgehub.service`` gives it (Python's ``-OO``, a bytecode cache directory):
it serves as it does anywhere else, its deployment check (pydantic and lark, in the child process that inherits
the environment) still refuses a bad manifest with every located problem, and the bytecode it writes is the
optimised kind, in the cache directory. ``bench.footprint`` measures the hub in this environment."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from bench.footprint import SERVICE_UNIT, service_environment
from tests.e2e.hub_process import EDGEHUB, identity_add, start, stop
from tests.e2e.test_upload_run_e2e import connect_device, landed

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]


def unit_env(tmp_path: Path) -> dict[str, str]:
    env = service_environment(SERVICE_UNIT, tmp_path / "cache")
    # a gateway writes its bytecode; this machine's shells may say not to ("" unsets it for Python)
    return {**env, "PYTHONDONTWRITEBYTECODE": ""}


def bytecode_in(root: Path) -> set[str]:
    return {p.name for p in root.rglob("*.pyc")}


def test_the_unit_runs_python_optimised_with_its_bytecode_in_the_cache_directory(tmp_path: Path) -> None:
    env = service_environment(SERVICE_UNIT, tmp_path)
    assert env["PYTHONOPTIMIZE"] == "2"
    assert env["PYTHONPYCACHEPREFIX"] == f"{tmp_path}/edgehub/pycache"
    assert "CacheDirectory=edgehub" in SERVICE_UNIT.read_text().splitlines()


async def test_a_hub_in_the_units_environment_serves_and_caches_optimised_bytecode(tmp_path: Path) -> None:
    data, landing, manifest = tmp_path / "data", tmp_path / "landing", tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}))
    cs = await identity_add(data, "dev1")
    env = unit_env(tmp_path)
    proc, port, _ = await start(data, manifest, "--upstream-upload", landing.as_uri(), env=env)
    dev = await connect_device(port, data, cs)
    mid = dev.publish("devices/dev1/messages/events/$.mid=m1", b'{"t": 21.5}')
    async with asyncio.timeout(10):
        assert await dev.publishes.get() == (mid, 0)
    segments = await landed(landing, 1)
    await dev.close()
    assert (await stop(proc)).rstrip().endswith("stopped")
    [record] = [r for rs in segments.values() for r in rs]
    assert (record.message_id, record.body) == ("m1", b'{"t": 21.5}')
    cached = bytecode_in(Path(env["PYTHONPYCACHEPREFIX"]))
    assert "serve.cpython-311.opt-2.pyc" in cached, sorted(cached)[:20]
    assert "serve.cpython-311.pyc" not in cached  # -OO: only the optimised kind


async def test_a_hub_in_the_units_environment_refuses_a_bad_manifest_with_every_located_problem(
    tmp_path: Path,
) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": "1.1",
                "routes": {"a": "FROM /* INTO $nowhere", "b": "FROM /* WHERE temperature > INTO $upstream"},
                "storeAndForwardConfiguration": {"maxQueueByts": 1},
            }
        )
    )
    proc = await asyncio.create_subprocess_exec(
        EDGEHUB,
        "run",
        "--manifest",
        str(manifest),
        "--data-dir",
        str(tmp_path / "d"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **unit_env(tmp_path)},
    )
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    lines = out.decode().splitlines()
    assert proc.returncode == 1, lines
    assert f"{manifest}: refused" in lines
    assert "  storeAndForwardConfiguration.maxQueueByts: unknown key" in lines
    assert any(line.startswith("  routes.a: unknown sink '$nowhere'") for line in lines), lines
    assert any(line.startswith("  routes.b: unexpected 'INTO'") for line in lines), lines
