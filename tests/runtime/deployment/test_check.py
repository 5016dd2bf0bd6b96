"""The manifest check in a child process (``edgehub.runtime.deployment.check``) gives the plan the check in process
gives, for every example and Azure sample; a refused document comes back with every error and its location; a
check that fails (no answer in time, an answer that is not one) refuses the deployment with that reason and
leaves the running one, never a crash; the running hub compiles the plan into the router the text gives."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from edgehub.core import Identity, Message
from edgehub.hub import Stored
from edgehub.hub.facade import EdgeHub
from edgehub.manifest import ManifestError, parse_deployment, read_manifest_file
from edgehub.routing import Router
from edgehub.runtime.deployment.check import plan_of
from edgehub.runtime.deployment.controller import DeploymentController, start_point
from edgehub.runtime.deployment.plan import (
    DeploymentCheckFailed,
    check_deployment,
    decode_answer,
    runnable,
)
from edgehub.runtime.deployment.settings import StartSettings, running_settings
from edgehub.store.rocks import open_rocks_store

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = sorted((ROOT / "deployment" / "examples").glob("*.json")) + [
    p
    for p in sorted((ROOT / "tests" / "manifest" / "azure_samples").glob("*.json"))
    if "authorization-policy" not in p.name  # refused (a deny rule): below
]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
async def test_the_child_gives_the_plan_the_check_in_process_gives(path: Path) -> None:
    document = read_manifest_file(path)
    plan = await check_deployment(document)
    assert plan == plan_of(document)
    deployment = parse_deployment(document)
    run = runnable(plan, StartSettings())
    assert run.settings == running_settings(deployment.desired, StartSettings())
    assert [r.route for r in run.router.routes] == [r.route for r in deployment.router.routes]
    assert [r.result for r in run.router.routes] == [r.result for r in deployment.router.routes]
    assert run.unsupported == deployment.unsupported
    assert run.grants == deployment.grants
    assert plan.module_twins == deployment.module_twins


async def test_a_refused_document_comes_back_with_every_error_and_its_location() -> None:
    document: dict[str, Any] = {
        "schemaVersion": "1.1",
        "routes": {"a": "FROM /messages/* INTO $nowhere"},
        "storeAndForwardConfiguration": {"maxQueueByts": 5},
    }
    with pytest.raises(ManifestError) as in_process:
        plan_of(document)
    with pytest.raises(ManifestError) as child:
        await check_deployment(document)
    assert not isinstance(child.value, DeploymentCheckFailed)
    assert child.value.errors == in_process.value.errors
    assert "storeAndForwardConfiguration.maxQueueByts: unknown key" in child.value.errors
    assert any(e.startswith("routes.a: unknown sink '$nowhere'") for e in child.value.errors)


async def test_a_check_with_no_answer_in_time_is_a_failed_check() -> None:
    with pytest.raises(DeploymentCheckFailed, match=r"no answer in 0\.001 s"):
        await check_deployment({"schemaVersion": "1.1"}, timeout_s=0.001)


@pytest.mark.parametrize("raw", [b"", b"not json", b'{"errors": "none"}', b'{"errors": [], "plan": {"routes": 1}}'])
def test_an_answer_that_is_not_one_is_a_failed_check(raw: bytes) -> None:
    with pytest.raises(DeploymentCheckFailed, match="its answer is not one"):
        decode_answer(raw)


async def test_a_failed_check_refuses_the_update_with_its_reason_and_the_hub_keeps_its_routes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = {"schemaVersion": "1.1", "routes": {"a": "FROM /messages/* INTO $upstream"}}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(first))
    store = open_rocks_store(tmp_path / "store")
    try:
        async with EdgeHub(store=store, router=Router({}), host_name="hub.test") as hub:
            controller = DeploymentController(hub, StartSettings())
            assert (await controller.start(path)).code == 200
            slow = DeploymentController(
                hub, StartSettings(), check=functools.partial(check_deployment, timeout_s=0.001)
            )
            with caplog.at_level(logging.INFO, logger="edgehub.runtime.deployment.controller"):
                status = await slow.put_desired({"schemaVersion": "1.1", "routes": {}}, source="admin")
            assert status.code == 400
            assert status.errors == ("(check): the manifest check failed: no answer in 0.001 s",)
            assert "refused reason=deployment_check_failed peer=admin" in caplog.text
            [outcome] = await hub.ingest(Identity.parse("dev1"), [Message(b"x")])
            assert isinstance(outcome, Stored)  # still routed to $upstream under the running deployment
    finally:
        await store.close()


async def test_a_start_runs_the_file_when_it_changed_and_else_the_deployment_that_last_applied_with_its_plan(
    tmp_path: Path,
) -> None:
    first = {"schemaVersion": "1.1", "routes": {"a": "FROM /messages/* WHERE p = 'x' INTO $upstream"}}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"modulesContent": {"$edgeHub": {"properties.desired": first}, "m": {}}}))
    document = read_manifest_file(path)
    store = open_rocks_store(tmp_path / "store")
    try:
        point = start_point(store, path, document)
        assert (point.document, point.plan, point.source) == (document, None, "file")  # nothing kept yet
        async with EdgeHub(store=store, router=Router({}), host_name="hub.test") as hub:
            controller = DeploymentController(hub, StartSettings())
            assert (await controller.start(path)).code == 200
            point = start_point(store, path, document)
            assert (point.document, point.plan) == (document, plan_of(document).section_only())
            path.write_text(json.dumps({**first, "routes": {}}))  # the file changed: it wins, checked again
            edited = read_manifest_file(path)
            point = start_point(store, path, edited)
            assert (point.document, point.plan, point.source) == (edited, None, "file")
            assert "changed" in point.reason
            path.write_text(json.dumps({"modulesContent": {"$edgeHub": {"properties.desired": first}, "m": {}}}))
            assert start_point(store, path, document).plan is not None
            patch: dict[str, object] = {"routes": {"b": "FROM /messages/* INTO $upstream"}}
            assert (await controller.patch_desired(patch, source="cloud")).code == 200
            # what runs is not the file's, and the file is unchanged since: what runs wins, with its kept plan
            point = start_point(store, path, document)
            assert point.document == controller.desired()
            assert point.source == "cloud"
            assert point.plan is not None
            assert {r.name for r in point.plan.routes} == {"a", "b"}
            path.write_text(json.dumps({**first, "routes": {}}))  # edited after the patch: the file wins again
            assert start_point(store, path, read_manifest_file(path)).source == "file"
    finally:
        await store.close()
