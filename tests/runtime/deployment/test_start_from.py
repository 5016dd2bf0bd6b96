"""``serve`` chooses the deployment a start runs by the rule of precedence (``start_point``): the deployment that
last applied while the manifest file is unchanged, the file once it changed, and the file when what the store kept
no longer passes the check (an upgrade may refuse it); it says which in one log line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.serve import serve
from edgehub.runtime.compose.store import store_path
from edgehub.runtime.deployment.plan import DeploymentPlan
from edgehub.runtime.deployment.state import STATE_KEY, decode_state, encode_state
from edgehub.store.rocks import open_rocks_store

pytestmark = pytest.mark.timeout(90)

UP = {"up": "FROM /messages/* INTO $upstream"}
FILE: dict[str, Any] = {"schemaVersion": "1.1", "routes": UP}


async def routes_run(config: HubConfig) -> list[str]:
    """One run of ``serve`` until ready, then stopped: the names of the routes its start ran."""
    stop = asyncio.Event()
    plans: list[DeploymentPlan] = []
    ready = asyncio.Event()
    task = asyncio.create_task(serve(config, stop=stop, on_checked=plans.append, on_ready=lambda _: ready.set()))
    try:
        async with asyncio.timeout(30):
            await ready.wait()
    finally:
        stop.set()
        async with asyncio.timeout(30):
            await task
    [plan] = plans
    return sorted(r.name for r in plan.routes)


async def keep(config: HubConfig, desired: dict[str, Any]) -> None:
    """Leave ``desired`` in the store as the deployment that last applied (as a cloud patch leaves it), with no
    kept plan, so the next start checks it."""
    store = open_rocks_store(store_path(config.data_dir))
    try:
        state = decode_state(store.get_metadata(STATE_KEY))
        assert state is not None
        await store.put_metadata(
            STATE_KEY, encode_state({**state, "desired": desired, "source": "cloud", "plan": None})
        )
    finally:
        await store.close()


async def test_a_start_runs_what_last_applied_while_the_file_is_unchanged_and_the_file_when_the_kept_one_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(FILE))
    config = HubConfig(manifest=manifest, data_dir=tmp_path / "data", mqtt_port=0, mqtts_port=None)
    caplog.set_level("INFO", logger="edgehub.runtime.compose.serve")
    assert await routes_run(config) == ["up"]
    assert "deployment.start_from source=file reason=first start" in caplog.text

    patched = {**FILE, "$version": 7, "routes": {**UP, "more": "FROM /messages/* INTO $upstream"}}
    await keep(config, patched)
    caplog.clear()
    assert await routes_run(config) == ["more", "up"]  # checked now (no plan kept), and run
    assert "deployment.start_from source=cloud reason=kept: version 7 from cloud" in caplog.text

    await keep(config, {**FILE, "routes": {"bad": "FROM /messages/* INTO $nowhere"}})
    caplog.clear()
    assert await routes_run(config) == ["up"]  # the kept one is refused: the file runs
    assert "deployment.kept_refused source=cloud errors=routes.bad" in caplog.text
    assert "deployment.start_from source=file reason=kept one refused: the file runs" in caplog.text

    await keep(config, patched)
    manifest.write_text(json.dumps({**FILE, "routes": {"edited": "FROM /messages/* INTO $upstream"}}))
    caplog.clear()
    assert await routes_run(config) == ["edited"]  # the file changed since: the file wins
    assert "the manifest file changed since the last start: the file wins" in caplog.text
