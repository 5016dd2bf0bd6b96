"""Watching the hub (issue 18): ``/status``, the dead-letter routes and ``/metrics`` of a running hub (real
``EdgeHub`` over RocksDB in tmp_path, MQTT head on 127.0.0.1, paho), and ``edgehub status`` /
``edgehub deadletter`` on the stopped hub's data directory (the console script as a process)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from edgehub.runtime.admin.client import AdminClient
from edgehub.runtime.admin.files import read_port, read_token
from edgehub.runtime.admin.server import serve_admin
from edgehub.runtime.admin.status import RateTracker, collect_status, format_status
from edgehub.store import StoreQuota
from tests.e2e.conftest import DEV, IN1, Rig, running_hub, sas, username
from tests.protocol_heads.mqtt.conftest import Paho

ROUTES = {"devices": f"FROM /messages/* INTO BrokeredEndpoint('{IN1}')"}
EDGEHUB = str(Path(sys.executable).parent / "edgehub")


@dataclass
class Admin:
    rig: Rig
    client: AdminClient

    async def call(self, method: str, path: str, **query: str) -> tuple[int, Any]:
        return await asyncio.to_thread(
            self.client.request, method, path, None, query=query or None, ok=tuple(range(200, 600))
        )


@asynccontextmanager
async def hub_with_three_queued(tmp_path: Path) -> AsyncIterator[tuple[Admin, Paho]]:
    """The hub with DEV connected and three of its messages queued for the (absent) filter module."""
    async with (
        running_hub(tmp_path, routes=ROUTES) as rig,
        serve_admin(tmp_path, port=0, hub=rig.hub, server=rig.server),
    ):
        port, token = read_port(tmp_path), read_token(tmp_path)
        assert port is not None
        assert token is not None
        dev = Paho.make(DEV.id)
        await dev.connect(rig.tcp, user=username(DEV), password=sas(DEV))
        try:
            for i in range(3):
                dev.publish("devices/dev1/messages/events/", b"x" * (100 + i))
            async with asyncio.timeout(10):
                for _ in range(3):
                    await dev.publishes.get()
            yield Admin(rig, AdminClient(port, token, timeout_s=10.0)), dev
        finally:
            await dev.close()


def edgehub(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EDGEHUB, *args], capture_output=True, text=True, timeout=60, check=False)


async def test_status_shows_each_queue_and_the_store_of_a_running_hub(tmp_path: Path) -> None:
    async with hub_with_three_queued(tmp_path) as (admin, _):
        code, doc = await admin.call("GET", "/status")
    assert code == 200
    assert doc["running"] is True
    (queue,) = [q for q in doc["queues"] if q["endpoint"] == IN1]
    assert queue["length"] == 3
    assert queue["bytes"] >= 303
    assert queue["oldest_age_s"] is not None
    assert 0 <= queue["oldest_age_s"] < 60  # on the clock the references were stamped with
    assert queue["in_flight"] == 0  # nobody to deliver to (a failed try waits for its retry: "retrying")
    assert 0 <= queue["retrying"] <= 3  # as many as the first try had read
    assert doc["endpoints"][IN1]["messages"] == 3
    assert doc["endpoints"][IN1]["dead_letters"] == 0
    assert doc["store"]["messages"] == 3
    assert doc["connected_clients"] == 1
    assert any(line.startswith(f"  {IN1} p") for line in format_status(doc))


async def test_time_until_full_follows_the_rates_the_tracker_measured(tmp_path: Path) -> None:
    async with running_hub(tmp_path, routes=ROUTES) as rig:
        store = rig.store
        tracker = RateTracker(store, window_s=60, interval_s=5)
        tracker.sample(now_s=0.0)
        dev = Paho.make(DEV.id)
        await dev.connect(rig.tcp, user=username(DEV), password=sas(DEV))
        try:
            for _ in range(10):
                dev.publish("devices/dev1/messages/events/", b"y" * 1000)
            async with asyncio.timeout(10):
                for _ in range(10):
                    await dev.publishes.get()
        finally:
            await dev.close()
        tracker.sample(now_s=10.0)
        held = store.usage(None)[1]
        store.store_quota = StoreQuota(max_bytes=held + 50_000)
        doc = collect_status(store, hub=rig.hub, rates=tracker)
    s = doc["store"]
    assert s["in_bps"] == round(held / 10, 1)  # all ten were stored between the two samples
    assert s["out_bps"] == 0  # nothing left
    assert s["full_in_s"] == round(50_000 / (held / 10), 1)


async def test_dead_letters_are_listed_requeued_and_purged_through_the_api(tmp_path: Path) -> None:
    async with hub_with_three_queued(tmp_path) as (admin, _):
        store = admin.rig.store
        (q,) = store.queues(IN1)
        items = store.read(q, 0, 10)
        await store.dead_letter(items[0], reason="max_attempts", attempts=5, error="refused")
        await store.dead_letter(items[1], reason="max_attempts", attempts=5, error="refused")
        code, listed = await admin.call("GET", "/deadletters", endpoint=IN1)
        assert code == 200
        assert [d["reason"] for d in listed["dead_letters"]] == ["max_attempts", "max_attempts"]
        assert listed["dead_letters"][0]["body_bytes"] == 100
        code, requeued = await admin.call("POST", "/deadletters/requeue", endpoint=IN1)
        assert (code, requeued) == (200, {"requeued": {IN1: 2}})
        assert store.dead_letters(IN1) == []
        await store.dead_letter(store.read(q, 0, 1)[0], reason="expired_in_dlq", attempts=1)
        code, purged = await admin.call("POST", "/deadletters/purge")
        assert (code, purged) == (200, {"purged": {IN1: 1}})
        unknown, answer = await admin.call("GET", "/deadletters", endpoint="nowhere")
        assert unknown == 400
        assert "no endpoint 'nowhere'" in answer["detail"]
        bad_limit, _ = await admin.call("GET", "/deadletters", limit="0")
        assert bad_limit == 400


async def test_a_dead_letter_limit_that_int_cannot_read_is_a_400_not_a_500(tmp_path: Path) -> None:
    async with hub_with_three_queued(tmp_path) as (admin, _):
        # past Python's digit limit; "²", which str.isdigit takes and int refuses
        for limit in ("9" * 5000, "\u00b2"):
            code, answer = await admin.call("GET", "/deadletters", limit=limit)
            assert (code, answer["error"]) == (400, "invalid_request")
            assert answer["detail"] == "limit: a number from 1 to 10000"


async def test_metrics_use_azure_names_and_read_the_hubs_counters(tmp_path: Path) -> None:
    async with hub_with_three_queued(tmp_path) as (admin, _):
        status, raw = await asyncio.to_thread(admin.client.raw, "GET", "/metrics")
        anonymous, _ = await asyncio.to_thread(
            AdminClient(admin.client.port, "", timeout_s=10.0).raw, "GET", "/metrics"
        )
    assert status == 200
    assert anonymous == 401
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(raw.decode())
        for s in family.samples
    }
    assert samples[("edgehub_messages_received_total", (("id", "dev1"),))] == 3
    assert samples[("edgehub_message_size_bytes_count", (("id", "dev1"),))] == 3
    assert samples[("edgehub_message_size_bytes_sum", (("id", "dev1"),))] >= 303
    lengths = [
        v for (name, labels), v in samples.items() if name == "edgehub_queue_length" and ("endpoint", IN1) in labels
    ]
    assert lengths == [3]
    assert samples[("edgehub_connected_clients", ())] == 1
    assert samples[("edgehub_store_messages", ())] == 3
    assert samples[("edgehub_messages_dropped_total", (("reason", "ttl_expiry"),))] == 0


async def test_status_and_dead_letters_work_on_a_stopped_hubs_data_directory(tmp_path: Path) -> None:
    async with hub_with_three_queued(tmp_path) as (admin, _):
        store = admin.rig.store
        (q,) = store.queues(IN1)
        await store.dead_letter(store.read(q, 0, 1)[0], reason="max_attempts", attempts=5)
    assert read_port(tmp_path) is None  # stopped

    done = await asyncio.to_thread(edgehub, "status", "--json", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["running"] is False
    (queue,) = [q for q in doc["queues"] if q["endpoint"] == IN1]
    assert queue["length"] == 3  # offsets past the checkpoint: the dead-lettered one's too
    assert doc["endpoints"][IN1] == {
        "messages": 2,
        "bytes": doc["endpoints"][IN1]["bytes"],
        "dead_letters": 1,
        "dead_letters_partial": False,
    }
    assert doc["store"]["in_bps"] is None
    assert doc["store"]["quota_bytes"] is not None

    listed = await asyncio.to_thread(edgehub, "deadletter", "list", "--data-dir", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    assert "reason=max_attempts attempts=5" in listed.stdout
    requeued = await asyncio.to_thread(edgehub, "deadletter", "requeue", "--endpoint", IN1, "--data-dir", str(tmp_path))
    assert requeued.returncode == 0, requeued.stderr
    assert requeued.stdout.startswith("requeued 1")
    wrong = await asyncio.to_thread(
        edgehub, "deadletter", "purge", "--endpoint", "nowhere", "--data-dir", str(tmp_path)
    )
    assert wrong.returncode == 1
    assert "no endpoint 'nowhere'" in wrong.stderr
