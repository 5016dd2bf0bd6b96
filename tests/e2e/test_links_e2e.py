"""``upstream.links`` through the composition root (``serve``), as ``edgehub run`` runs it: a cheap and a metered
link, each through its own link simulator to one real Mosquitto, a paho device into the MQTT head, the admin API.
The cheap link's cut sends the alarm over the metered link while telemetry waits; ``/status`` shows each link; and
a restart of the hub remembers the metered link's bytes of this period (the ledger in the data directory), which
``edgehub status`` of the stopped hub then shows, per budget (the metered link has a day's and a month's). Links
given by the admin API to a running hub are named in ``restartRequired`` and run from the next start."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from edgehub.core import Identity
from edgehub.runtime.admin.client import AdminClient, running_hub
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.links import BUDGET_FILE
from edgehub.runtime.compose.store import open_identities, open_store
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.segment import decode_segment
from tests.e2e.serving import serving, status_until
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]


def manifest(path: Path, cheap: LinkSim, metered: LinkSim) -> None:
    routes = {
        "alarms": {"route": "FROM /messages/* WHERE kind = 'alarm' INTO $upstream", "priority": 0},
        "telemetry": {"route": "FROM /messages/* WHERE kind = 'tele' INTO $upstream", "priority": 5},
    }
    links = [
        {"name": "cell", "address": f"127.0.0.1:{cheap.port}", "keepaliveSecs": 1, "settleSecs": 1},
        {
            "name": "sat",
            "address": f"127.0.0.1:{metered.port}",
            "username": "gw-sat",
            "passwordEnv": "EDGEHUB_TEST_SAT_PASSWORD",
            "costPerMiB": 8,
            "priorities": "0-1",
            "budget": [{"bytes": 1_000_000, "period": "day"}, {"bytes": 30_000_000, "period": "month"}],
            "allowedOverBudget": "0",
        },
    ]
    path.write_text(json.dumps({"schemaVersion": "1.1", "routes": routes, "upstream": {"links": links}}))


@asynccontextmanager
async def hub(
    data: Path, manifest_path: Path, *, broker_port: int | None = None
) -> AsyncIterator[tuple[AdminClient, int]]:
    """The hub as ``serve`` runs it; its single upstream (what ``links`` replace) to the broker on ``broker_port``."""
    host, port = ("unused", 1883) if broker_port is None else ("127.0.0.1", broker_port)
    upstream = MqttUpstreamSettings(host=host, port=port, client_id="gw", hub_id="gw", linger_s=0.0)
    config = HubConfig(
        manifest=manifest_path, data_dir=data, mqtt_port=0, mqtts_port=None, upstream=upstream, admin_port=0
    )
    async with serving(config) as ready:
        client = await asyncio.to_thread(running_hub, data)
        assert client is not None
        yield client, ready["tcp"]


def links_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k["link"]: k for k in status["links"] or []}


async def test_a_cut_sends_the_alarm_over_the_metered_link_and_a_restart_remembers_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEHUB_TEST_SAT_PASSWORD", "s3cret")  # the manifest names it; the broker takes anyone
    data = tmp_path / "data"
    store = open_store(data)
    await open_identities(store, "localhost", data_dir=data).set_password(Identity.parse("dev1"), b"pw")
    await store.close()
    async with (
        MosquittoPeer(tmp_path) as broker,
        LinkSim(target_host=broker.host, target_port=broker.port) as cheap,
        LinkSim(target_host=broker.host, target_port=broker.port) as metered,
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
    ):
        manifest(tmp_path / "m.json", cheap, metered)
        async with asyncio.timeout(60), hub(data, tmp_path / "m.json") as (client, port):
            both_up = await status_until(
                client, lambda s: {k["state"] for k in links_of(s).values()} == {"up"} and len(links_of(s)) == 2
            )
            assert links_of(both_up)["cell"]["carries_now"] == "0-10"
            cheap.cut()
            await status_until(client, lambda s: links_of(s)["cell"]["state"] == "down")
            device = Paho.make("dev1")
            assert await device.connect(port, user="dev1", password="pw") == 0
            device.publish("devices/dev1/messages/events/kind=tele", b"reading")
            device.publish("devices/dev1/messages/events/kind=alarm", b"fire")
            while b"fire" not in [r.body for m in sink.messages for r in decode_segment(m.payload)]:
                await sink.wait_for(len(sink.messages) + 1)
            during = await status_until(client, lambda s: links_of(s)["sat"]["bytes_this_period"] > 0)
            sat = links_of(during)["sat"]
            assert sat["carries_now"] == "0-1"
            assert sat["budget_left_bytes"] == 1_000_000 - sat["bytes_this_period"]  # the day's binds
            sat_day, sat_month = sat["periods"]
            assert (sat_day["period"], sat_day["bytes"]) == ("day", sat["bytes_this_period"])
            assert sat_month["period"] == "month"
            assert sat_month["bytes"] >= sat_day["bytes"]  # equal, unless a UTC day began during the test
            assert b"reading" not in [r.body for m in sink.messages for r in decode_segment(m.payload)]
            tele = next(q for q in during["queues"] if q["endpoint"] == "$upstream" and q["priority"] == 5)
            assert tele["length"] == 1  # waiting for the cheap link, in the store
            cheap.restore()
            while b"reading" not in [r.body for m in sink.messages for r in decode_segment(m.payload)]:
                await sink.wait_for(len(sink.messages) + 1)
            await device.close()
            sat_bytes = sat["bytes_this_period"]
        assert (data / BUDGET_FILE).exists()
        async with asyncio.timeout(60), hub(data, tmp_path / "m.json") as (client, _):
            again = await status_until(client, lambda s: len(links_of(s)) == 2)
            assert links_of(again)["sat"]["bytes_this_period"] >= sat_bytes  # the morning's bytes, remembered
        # Stopped: the status reads the ledger the hub left.
        edgehub = str(Path(sys.executable).parent / "edgehub")
        done = await asyncio.to_thread(
            subprocess.run,
            [edgehub, "status", "--json", "--data-dir", str(data)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        ledger = {k["link"]: k for k in json.loads(done.stdout)["link_ledger"]["links"]}
        assert {p["period"] for p in ledger["cell"]["periods"]} == {"day"}
        day, month = ledger["sat"]["periods"]
        assert (day["period"], month["period"]) == ("day", "month")
        assert month["bytes"] >= day["bytes"]
        assert month["bytes"] >= sat_bytes
        assert month["budget_left_bytes"] == 30_000_000 - month["bytes"]


async def test_links_the_admin_api_gives_a_running_hub_need_a_restart_and_the_restart_runs_them(
    tmp_path: Path,
) -> None:
    data, path = tmp_path / "data", tmp_path / "m.json"
    path.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}))
    async with MosquittoPeer(tmp_path) as broker:
        links = [{"name": "sat", "address": f"127.0.0.1:{broker.port}", "costPerMiB": 8}]
        async with asyncio.timeout(60), hub(data, path, broker_port=broker.port) as (client, _):
            code, _ = await asyncio.to_thread(client.request, "PATCH", "/twin/desired", {"upstream": {"links": links}})
            assert code == 200
            _, reported = await asyncio.to_thread(client.request, "GET", "/twin/reported")
            assert isinstance(reported, dict)
            assert reported["restartRequired"] == ["upstream.links"], reported
            _, status = await asyncio.to_thread(client.request, "GET", "/status")
            assert isinstance(status, dict)
            assert links_of(status) == {}  # not yet: the single upstream runs as it started
        # The restart, the file unchanged: the deployment the admin API gave runs, its link with it.
        async with asyncio.timeout(60), hub(data, path, broker_port=broker.port) as (client, _):
            up = await status_until(client, lambda s: links_of(s).get("sat", {}).get("state") == "up")
            assert links_of(up)["sat"]["cost_per_mib"] == 8
            _, reported = await asyncio.to_thread(client.request, "GET", "/twin/reported")
            assert isinstance(reported, dict)
            assert (reported["source"].split()[0], reported["restartRequired"]) == ("admin-api", [])
