"""The links of a running hub in ``GET /status``, ``edgehub status``'s lines and ``GET /metrics``: a real ``EdgeHub``
over RocksDB whose ``$upstream`` is a ``LinkedUpstream`` over two link simulators to Mosquitto, a paho device
sending, the admin API on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgehub.runtime.admin.client import AdminClient
from edgehub.runtime.admin.files import read_port, read_token
from edgehub.runtime.admin.server import serve_admin
from edgehub.runtime.admin.status import format_status
from edgehub.testing.linksim import LinkSim
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.budget import Budget, BudgetLedger, Period
from edgehub.upstream.links import LinkedUpstream, LinkSpec
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from tests.e2e.conftest import DEV, running_hub, sas, username
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

ROUTES = {"up": "FROM /messages/* INTO $upstream"}


def mqtt(sim: LinkSim, client_id: str) -> MqttUpstream:
    return MqttUpstream(
        MqttUpstreamSettings(
            host="127.0.0.1", port=sim.port, client_id=client_id, hub_id="gw", reconnect_min_s=0.1, reconnect_max_s=0.5
        )
    )


async def test_status_and_metrics_show_each_link_its_state_bytes_cost_budget_and_what_it_carries(
    tmp_path: Path, broker: MosquittoPeer
) -> None:
    async with (
        LinkSim(target_host=broker.host, target_port=broker.port) as cheap,
        LinkSim(target_host=broker.host, target_port=broker.port) as metered,
    ):
        cell = LinkSpec(name="cell")
        sat = LinkSpec(
            name="sat",
            cost_per_mib=8.0,
            budgets=(Budget(10_000_000, Period.DAY), Budget(40_000_000, Period.MONTH)),
            priorities=frozenset(range(11)),
            over_budget=frozenset({0}),
        )
        ledger = BudgetLedger(tmp_path / "links" / "budget.json", {"cell": ((), 0.0), "sat": (sat.budgets, 8.0)})
        up = LinkedUpstream([(cell, mqtt(cheap, "gw")), (sat, mqtt(metered, "gw-sat"))], ledger)
        await up.start()  # the executor closes it when the hub stops
        async with (
            asyncio.timeout(40),
            running_hub(tmp_path / "hub", routes=ROUTES, endpoints=[up]) as rig,
            serve_admin(tmp_path / "hub", port=0, hub=rig.hub, server=rig.server),
        ):
            port, token = read_port(tmp_path / "hub"), read_token(tmp_path / "hub")
            assert port is not None
            assert token is not None
            admin = AdminClient(port, token, timeout_s=10.0)
            await up.wait_for(lambda: up.connected and all(t.connected for t in up.transports))  # type: ignore[attr-defined]
            cheap.cut()  # everything goes over the metered link now
            await up.wait_for(lambda: not up.transports[0].connected)  # type: ignore[attr-defined]
            dev = Paho.make(DEV.id)
            assert await dev.connect(rig.tcp, user=username(DEV), password=sas(DEV)) == 0
            try:
                dev.publish("devices/dev1/messages/events/", os.urandom(2000))  # incompressible
                await dev.publishes.get()
                await rig.hub.executors["$upstream"].wait_for(lambda: up.status().messages_acked == 1)
            finally:
                await dev.close()
            code, answer = await asyncio.to_thread(admin.request, "GET", "/status")
            assert code == 200
            assert isinstance(answer, dict)
            doc: dict[str, Any] = answer
            status, raw = await asyncio.to_thread(admin.raw, "GET", "/metrics")
        assert status == 200
    links = {k["link"]: k for k in doc["links"]}
    assert links["cell"]["state"] == "down"
    assert links["cell"]["carries_now"] == ""
    assert links["sat"]["state"] == "up"
    assert links["sat"]["carries_now"] == "0-10"
    assert links["sat"]["preference"] == 1
    assert links["sat"]["bytes_this_period"] > 2000  # the PUBLISH of the segment and its estimated overhead
    assert links["sat"]["cost_this_period"] == pytest.approx(links["sat"]["bytes_this_period"] / 2**20 * 8, abs=1e-4)
    assert links["sat"]["budget_left_bytes"] == 10_000_000 - links["sat"]["bytes_this_period"]
    assert links["sat"]["period"] == "day"  # of its two budgets, the day's has the fewer bytes left
    day, month = links["sat"]["periods"]
    assert (day["period"], day["budget_bytes"], day["bytes"]) == ("day", 10_000_000, links["sat"]["bytes_this_period"])
    assert (month["period"], month["budget_bytes"], month["bytes"]) == ("month", 40_000_000, day["bytes"])
    assert month["budget_left_bytes"] == 40_000_000 - month["bytes"]
    assert links["cell"]["budget_bytes"] is None
    assert [p["period"] for p in links["cell"]["periods"]] == ["day"]  # counted over a day, for the status
    lines = format_status(doc)
    assert any(line.startswith("link $upstream sat: up, carries 0-10") for line in lines)
    assert any(line.startswith("  this month (from ") and "of 40000000 B left" in line for line in lines)
    assert any(line.startswith("link $upstream cell: down, carries nothing") for line in lines)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(raw.decode())
        for s in family.samples
    }
    sat_key = (("lane", "$upstream"), ("link", "sat"))
    cell_key = (("lane", "$upstream"), ("link", "cell"))
    sat_day, sat_month = (*sat_key, ("period", "day")), (*sat_key, ("period", "month"))
    assert samples[("edgehub_link_up", sat_key)] == 1.0
    assert samples[("edgehub_link_up", cell_key)] == 0.0
    assert samples[("edgehub_link_period_bytes", sat_day)] == links["sat"]["bytes_this_period"]
    assert samples[("edgehub_link_period_bytes", sat_month)] == month["bytes"]
    assert samples[("edgehub_link_budget_left_bytes", sat_day)] == links["sat"]["budget_left_bytes"]
    assert samples[("edgehub_link_budget_left_bytes", sat_month)] == month["budget_left_bytes"]
    assert samples[("edgehub_link_budget_used_percent_mark", sat_month)] == 0
    assert ("edgehub_link_budget_left_bytes", (*cell_key, ("period", "day"))) not in samples  # no budget
    assert samples[("edgehub_link_carries", (*sat_key, ("priority", "5")))] == 1
    assert ("edgehub_link_carries", (*cell_key, ("priority", "5"))) not in samples
