"""The DeploymentController over a real hub and a RocksDB store: updates switch routes, policies and quotas
together, a refused update changes nothing, patches merge, dropped endpoints are counted, the state outlives a
restart and the watched manifest file is applied when it changes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from edgehub.core import Identity, Message
from edgehub.hub import Rejected, Stored
from edgehub.hub.facade import EdgeHub
from edgehub.hub.twins import check_patch
from edgehub.manifest import ManifestError
from edgehub.runtime.deployment.controller import DeploymentController
from edgehub.runtime.deployment.settings import StartSettings
from edgehub.store import FsyncPolicy, QueueId, RemovalReason, Store
from edgehub.store.rocks import open_rocks_store
from protocol_heads.mqtt.iothub import Acl

pytestmark = pytest.mark.timeout(60)

DEV = Identity.parse("dev1")
INPUT = "/modules/filter/inputs/in1"


def desired(routes: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"schemaVersion": "1.1", "routes": routes, **kw}


def manifest(routes: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"modulesContent": {"$edgeHub": {"properties.desired": desired(routes, **kw)}}}


TO_MODULE = {"m": {"route": f'FROM /messages/* INTO BrokeredEndpoint("{INPUT}")', "priority": 5}}


@asynccontextmanager
async def running(tmp_path: Path, document: dict[str, Any]) -> AsyncIterator[tuple[DeploymentController, EdgeHub]]:
    path = tmp_path / "manifest.json"
    if not path.exists():
        path.write_text(json.dumps(document))
    store = open_rocks_store(tmp_path / "store")
    try:
        from edgehub.manifest import parse_deployment, read_manifest_file

        router = parse_deployment(read_manifest_file(path)).router
        async with EdgeHub(store=store, router=router, host_name="hub.test") as hub:
            controller = DeploymentController(hub, StartSettings())
            await controller.start(path)
            yield controller, hub
    finally:
        await store.close()


def assert_twin_keys(document: object, top: bool = True) -> None:
    """Every key is one IoT Hub takes in a twin (no '$', '.' or space; the hub's own check_patch, too)."""
    if isinstance(document, dict):
        for key, value in document.items():
            assert not any(c in key for c in "$. "), key
            assert_twin_keys(value, top=False)
    elif isinstance(document, list):
        for value in document:
            assert_twin_keys(value, top=False)
    if top:
        check_patch(json.loads(json.dumps(document)))


async def send(hub: EdgeHub, **props: str) -> Stored | Rejected:
    [outcome] = await hub.ingest(DEV, [Message(b"x" * 10, properties=dict(props))])
    assert isinstance(outcome, Stored | Rejected)
    return outcome


def held(store: Store, endpoint: str, priority: int) -> int:
    """References in the queue (nothing is delivered here: no module is connected)."""
    q = QueueId(endpoint, priority)
    return store.count(q) if q in store.queues(endpoint) else 0


async def test_an_update_switches_routes_and_reports_its_version_while_stored_messages_keep_their_priority(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, hub):
        assert isinstance(await send(hub), Stored)
        routes = {"m": {"route": TO_MODULE["m"]["route"], "priority": 0}}
        status = await controller.put_desired(desired(routes, **{"$version": 3}), source="admin")
        assert (status.code, status.version) == (200, 3)
        assert isinstance(await send(hub), Stored)
        assert (held(hub.store, INPUT, 5), held(hub.store, INPUT, 0)) == (1, 1)
        reported = controller.reported()
        assert reported["lastDesiredVersion"] == 3
        assert reported["lastDesiredStatus"] == {"code": 200, "description": "applied", "errors": []}
        queues = reported["queues"]
        assert isinstance(queues, list)
        assert [(q["endpoint"], q["priority"], q["length"]) for q in queues] == [(INPUT, 0, 1), (INPUT, 5, 1)]
        assert all(isinstance(q["bytes"], int) and q["bytes"] > 0 for q in queues)
        in_force = reported["running"]
        assert isinstance(in_force, dict)
        assert in_force["routes"] == {"m": {"route": routes["m"]["route"], "priority": 0, "timeToLiveSecs": None}}
        assert_twin_keys(reported)


async def test_a_refused_update_reports_every_error_and_leaves_the_running_configuration(tmp_path: Path) -> None:
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, hub):
        bad = desired({"m": "FROM /messages/* INTO $nowhere"}, storeAndForwardConfiguration={"maxQueueByts": 1})
        bad["$version"] = 9
        status = await controller.put_desired(bad, source="admin")
        assert (status.code, status.version) == (400, 9)
        assert "storeAndForwardConfiguration.maxQueueByts: unknown key" in status.errors
        assert any(e.startswith("routes.m: unknown sink '$nowhere'") for e in status.errors)
        assert isinstance(await send(hub), Stored)
        assert held(hub.store, INPUT, 5) == 1  # routed by the old routes
        reported = controller.reported()
        assert reported["lastDesiredVersion"] == 9
        assert reported["runningDesiredVersion"] == 1
        status_doc = reported["lastDesiredStatus"]
        assert isinstance(status_doc, dict)
        assert status_doc["code"] == 400
        assert "maxQueueByts" in status_doc["description"]


async def test_a_merge_patch_adds_and_removes_routes_and_counts_the_version_on(tmp_path: Path) -> None:
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, hub):
        extra = "FROM /messages/* WHERE kind = 'alarm' INTO BrokeredEndpoint(\"/modules/alarms/inputs/in\")"
        status = await controller.patch_desired({"routes": {"alarm": extra}, "$version": 5}, source="cloud")
        assert (status.code, status.version) == (200, 5)
        assert sorted(r.name for r in hub.router.routes) == ["alarm", "m"]
        status = await controller.patch_desired({"routes": {"alarm": None}}, source="cloud")
        assert (status.code, status.version) == (200, 6)
        assert [r.name for r in hub.router.routes] == ["m"]
        refused = await controller.patch_desired(
            {"routes": {"m": {"route": "FROM /* INTO $upstream", "x": 1}}}, source="cloud"
        )
        assert refused.errors == ("routes.m.x: unknown key",)
        assert [r.name for r in hub.router.routes] == ["m"]


async def test_queue_policies_and_quotas_from_an_update_meet_the_next_message(tmp_path: Path) -> None:
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, hub):
        policy = {"queuePolicy": {"maxQueueMessages": 2, "overflow": "rejectIncoming", "enqueueTimeoutSecs": 0}}
        status = await controller.put_desired(desired(TO_MODULE, endpoints={INPUT: policy}), source="admin")
        assert status.code == 200
        assert [type(await send(hub)) for _ in range(3)] == [Stored, Stored, Rejected]
        status = await controller.patch_desired(
            {"endpoints": {INPUT: {"queuePolicy": {"overflow": "discardOldest"}}}}, source="admin"
        )
        assert status.code == 200
        assert isinstance(await send(hub), Stored)
        assert held(hub.store, INPUT, 5) == 2  # the oldest went
        assert hub.store.removed[RemovalReason.OVERFLOW] == 1


async def test_every_executor_takes_its_own_settings_and_the_store_its_fsync_policy(tmp_path: Path) -> None:
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, hub):
        await send(hub)
        executor = hub.executors[INPUT]
        status = await controller.put_desired(
            desired(
                TO_MODULE,
                storeAndForwardConfiguration={"fsync": "interval", "fsyncIntervalMs": 50, "cleanupIntervalSecs": 5},
                delivery={"maxDeliveryAttempts": 7},
                endpoints={INPUT: {"maxDeliveryAttempts": 3}},
            ),
            source="admin",
        )
        assert status.code == 200
        assert executor.settings.max_delivery_attempts == 3
        assert executor.settings.cleanup_interval_s == 5
        assert hub.executor_settings_for("/modules/other/inputs/x").max_delivery_attempts == 7
        assert hub.store.fsync is FsyncPolicy.INTERVAL


async def test_an_endpoint_no_longer_named_drains_unless_the_update_drops_it_and_drops_are_counted(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, hub):
        for _ in range(3):
            await send(hub)
        elsewhere = {"up": "FROM /messages/* INTO $upstream"}
        assert (await controller.put_desired(desired(elsewhere), source="admin")).code == 200
        assert held(hub.store, INPUT, 5) == 3  # drains: kept for the module
        status = await controller.put_desired(desired(elsewhere, endpoints={INPUT: {"drop": True}}), source="admin")
        assert status.code == 200
        assert held(hub.store, INPUT, 5) == 0
        assert controller.reported()["droppedOnUpdate"] == [{"endpoint": INPUT, "messages": 3}]
        assert hub.store.removed[RemovalReason.DROPPED] == 3


async def test_grants_from_mqtt_broker_reach_the_acl_of_running_connections(tmp_path: Path) -> None:
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, _hub):
        acl = Acl(publish_grants=controller.publish_grants, subscribe_grants=controller.subscribe_grants)
        assert not acl.may_publish(DEV, "local/dev1/t")
        broker = {
            "authorizations": [
                {
                    "identities": ["{{iot:identity}}"],
                    "allow": [{"operations": ["mqtt:publish"], "resources": ["local/{{iot:device_id}}/#"]}],
                }
            ]
        }
        status = await controller.put_desired(
            desired(TO_MODULE, schemaVersion="1.2", mqttBroker=broker), source="admin"
        )
        assert status.code == 200
        assert acl.may_publish(DEV, "local/dev1/t")
        assert not acl.may_publish(DEV, "local/dev2/t")
        assert (await controller.put_desired(desired(TO_MODULE), source="admin")).code == 200
        assert not acl.may_publish(DEV, "local/dev1/t")


async def test_the_running_state_outlives_a_restart_while_the_manifest_file_is_unchanged(tmp_path: Path) -> None:
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, _hub):
        extra = {"up": "FROM /messages/* INTO $upstream"}
        assert (await controller.patch_desired({"routes": extra, "$version": 4}, source="cloud")).code == 200
    for _ in range(2):  # and again: the state kept at a restart still knows the file
        async with running(tmp_path, manifest(TO_MODULE)) as (controller, hub):
            assert sorted(r.name for r in hub.router.routes) == ["m", "up"]
            assert controller.reported()["lastDesiredVersion"] == 4
    (tmp_path / "manifest.json").write_text(json.dumps(manifest(TO_MODULE, **{"$version": 10})))
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, hub):
        assert [r.name for r in hub.router.routes] == ["m"]  # the file changed: it wins
        assert controller.reported()["lastDesiredVersion"] == 10


async def test_a_manifest_the_hub_refuses_at_start_raises_with_every_error(tmp_path: Path) -> None:
    retry = {"retryPolicy": {"minimumDelaySecs": 9, "maximumDelaySecs": 1}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest(TO_MODULE, delivery=retry)))
    with pytest.raises(BaseException) as err:  # the hub's task groups wrap it: unwrapped below
        async with running(tmp_path, {}):
            pass
    leaf = err.value
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    assert isinstance(leaf, ManifestError)
    assert leaf.errors == ("delivery.retryPolicy: need 0 <= minimumDelaySecs <= maximumDelaySecs",)


async def test_the_watched_manifest_file_is_applied_when_it_changes(tmp_path: Path) -> None:
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, hub):
        changed = asyncio.Event()
        seen: list[dict[str, object]] = []

        def on_reported(reported: dict[str, object]) -> None:
            seen.append(reported)
            changed.set()

        controller.on_reported(on_reported)
        watcher = asyncio.create_task(controller.watch(tmp_path / "manifest.json", interval_s=0.05))
        try:
            (tmp_path / "manifest.json").write_text(
                json.dumps(manifest({"up": "FROM /messages/* INTO $upstream"}, **{"$version": 2}))
            )
            async with asyncio.timeout(10):
                await changed.wait()
            assert seen[-1]["lastDesiredVersion"] == 2
            assert [r.name for r in hub.router.routes] == ["up"]
            changed.clear()
            (tmp_path / "manifest.json").write_text("{not json")
            async with asyncio.timeout(10):
                await changed.wait()
            status = seen[-1]["lastDesiredStatus"]
            assert isinstance(status, dict)
            assert status["code"] == 400
            assert "not JSON" in str(status["description"])
            assert [r.name for r in hub.router.routes] == ["up"]
        finally:
            watcher.cancel()


async def test_stored_messages_keep_their_ttl_and_a_store_quota_from_an_update_holds(tmp_path: Path) -> None:
    async with running(tmp_path, manifest(TO_MODULE)) as (controller, hub):
        await send(hub)
        saf = {"timeToLiveSecs": 60, "maxStoreMessages": 2}
        policy = {"queuePolicy": {"enqueueTimeoutSecs": 0}}
        status = await controller.put_desired(
            desired(TO_MODULE, storeAndForwardConfiguration=saf, delivery=policy), source="admin"
        )
        assert status.code == 200
        assert isinstance(await send(hub), Stored)
        assert isinstance(await send(hub), Rejected)  # the store holds its quota of 2
        [queue] = hub.store.queues(INPUT)
        ttls = [r.ttl_s for r in hub.store.references(queue, 0, 10)]
        assert ttls == [7200, 60]  # the first keeps the TTL it was stored with
        assert hub.store.usage(None)[0] == 2
