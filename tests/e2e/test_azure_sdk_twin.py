"""The Azure IoT device SDK's module client and the twins a deployment gives: ``get_twin`` answers the
manifest's ``modulesContent.<module>.properties.desired``, an edit of the manifest reaches the SDK's desired
patch handler while it stays connected, and its reported patch is kept (an ``edgehub run`` process on its
defaults; the driver and the SDK's venv as in ``test_azure_sdk``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_azure_sdk import Sdk, edgehub_cli, edgehub_run, sdk, sdk_python

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

__all__ = ["sdk", "sdk_python"]  # the fixtures, used by name


def write(manifest: Path, version: int, desired: dict[str, Any]) -> None:
    content = {
        "$edgeHub": {"properties.desired": {"schemaVersion": "1.1", "$version": version, "routes": {}}},
        "filter": {"properties.desired": desired},
    }
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps({"modulesContent": content}))
    os.replace(tmp, manifest)


async def test_an_sdk_module_gets_its_desired_properties_from_the_manifest_and_each_change_pushed(
    tmp_path: Path, sdk: Sdk
) -> None:
    data, manifest = tmp_path / "data", tmp_path / "manifest.json"
    write(manifest, 1, {"threshold": 25, "unit": "C"})
    module = await edgehub_cli("identity", "add", "edge", "--module", "filter", "--data-dir", str(data))
    async with edgehub_run(sdk, data, manifest, tmp_path / "edgehub-run.log"):
        ca = data / "certs" / "ca.pem"
        async with sdk.run("twin", ca, module, patches=1, report={"applied": 25}) as client:
            twin = await client.event()
            assert twin["event"] == "twin"
            assert twin["desired"] == {"threshold": 25, "unit": "C", "$version": 1}
            assert await client.event() == {"event": "reported"}
            assert await client.event() == {"event": "ready"}
            write(manifest, 2, {"threshold": 30})
            assert await client.event() == {"event": "patch", "patch": {"threshold": 30, "unit": None, "$version": 2}}
            assert await client.event() == {"event": "done"}
        async with sdk.run("twin", ca, module) as client:
            twin = await client.event()
            assert twin["desired"] == {"threshold": 30, "$version": 2}
            assert twin["reported"]["applied"] == 25
