"""From ``upstream.links`` to transports: each link's settings over the hub's, its secrets from the environment or a
file (a missing one stops the start naming the link), client ids that differ, and the ledger in the data
directory; one ``LinkedUpstream`` per lane, which connects every link."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from edgehub.core import ConfigurationError
from edgehub.manifest import load_desired
from edgehub.runtime.compose.config import UploadUpstreamSettings
from edgehub.runtime.compose.links import BUDGET_FILE, link_spec, link_transport_settings, linked_lanes
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.budget import Budget, Period
from edgehub.upstream.links import LinkedUpstream
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, TlsSettings
from edgehub.upstream.mqtt.transport import MqttUpstream

BASE = MqttUpstreamSettings(host="flag.example", client_id="gw-17", hub_id="gw-17", linger_s=0.05)


def links(*entries: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries as the checked manifest hands them over (``model_dump``)."""
    desired = load_desired({"schemaVersion": "1.1", "upstream": {"links": list(entries)}})
    assert desired.upstream.links is not None
    return [link.model_dump() for link in desired.upstream.links]


def test_a_link_takes_the_hubs_settings_with_its_own_keys_over_them() -> None:
    cell, sat = links(
        {"name": "cell", "address": "cell.example:8883", "keepaliveSecs": 5, "linkRateBps": 256000},
        {"name": "sat", "address": "sat.example:1883", "linkRttMs": 700, "caFile": "/etc/ca.pem"},
    )
    c = link_transport_settings(cell, BASE, first=True, env={})
    s = link_transport_settings(sat, BASE, first=False, env={})
    assert isinstance(c, MqttUpstreamSettings)
    assert isinstance(s, MqttUpstreamSettings)
    assert (c.host, c.port, c.client_id, c.keepalive_s, c.link_rate_bps) == ("cell.example", 8883, "gw-17", 5, 256000)
    assert (s.host, s.port, s.client_id, s.link_rtt_s) == ("sat.example", 1883, "gw-17-sat", 0.7)
    assert s.tls == TlsSettings(ca_certs="/etc/ca.pem")
    assert c.linger_s == s.linger_s == 0.05  # the hub's own settings flow through
    assert c.hub_id == s.hub_id == "gw-17"  # one hub in the cloud, whichever link


def test_secrets_come_from_the_environment_or_a_file(tmp_path: Path) -> None:
    (tmp_path / "sat.sas").write_text("SharedAccessSignature sr=x\n")
    cell, sat = links(
        {"name": "cell", "address": "a:1", "username": "gw", "passwordEnv": "CELL_PW"},
        {"name": "sat", "address": "b:2", "sasTokenFile": str(tmp_path / "sat.sas")},
    )
    c = link_transport_settings(cell, BASE, first=True, env={"CELL_PW": "s3cret"})
    s = link_transport_settings(sat, BASE, first=False, env={})
    assert isinstance(c, MqttUpstreamSettings)
    assert isinstance(s, MqttUpstreamSettings)
    assert (c.username, c.password) == ("gw", "s3cret")
    assert s.sas_token == "SharedAccessSignature sr=x"  # the file's newline is not part of it


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"name": "cell", "address": "a:1", "passwordEnv": "NOT_SET_ANYWHERE"}, "NOT_SET_ANYWHERE is not set"),
        ({"name": "cell", "address": "a:1", "sasTokenFile": "/nonexistent/sas"}, "No such file"),
    ],
)
def test_a_secret_that_is_not_there_stops_the_start_naming_the_link(entry: dict[str, Any], named: str) -> None:
    (link,) = links(entry)
    with pytest.raises(ConfigurationError, match=named) as info:
        link_transport_settings(link, BASE, first=True, env={})
    assert "'cell'" in str(info.value)


def test_an_upload_link_and_a_link_without_the_flag_settings() -> None:
    lake, cell = links(
        {"name": "lake", "transport": "upload", "url": "/data/landing"}, {"name": "cell", "address": "a:1"}
    )
    u = link_transport_settings(lake, None, first=True, env={})
    assert isinstance(u, UploadUpstreamSettings)
    assert u.url == "/data/landing"
    m = link_transport_settings(cell, UploadUpstreamSettings(url="/x", hub_id="gw-9"), first=True, env={})
    assert isinstance(m, MqttUpstreamSettings)
    assert (m.client_id, m.hub_id) == ("gw-9", "gw-9")


def test_a_link_spec_reads_cost_budget_and_priorities() -> None:
    (sat,) = links(
        {
            "name": "sat",
            "address": "b:2",
            "costPerMiB": 8.5,
            "priorities": "0-1",
            "budget": {"bytes": 1000, "period": "month", "startHourUtc": 3},
            "allowedOverBudget": "0",
            "settleSecs": 30,
            "tls": True,
        }
    )
    spec = link_spec(sat)
    assert spec.cost_per_mib == 8.5
    assert spec.priorities == frozenset({0, 1})
    assert spec.over_budget == frozenset({0})
    assert spec.budgets == (Budget(1000, Period.MONTH, 3),)
    assert spec.settle_s == 30
    assert spec.tls


async def test_each_lane_gets_a_linked_upstream_whose_links_connect(tmp_path: Path, broker: MosquittoPeer) -> None:
    entries = links(
        {"name": "cell", "address": f"127.0.0.1:{broker.port}"},
        {
            "name": "sat",
            "address": f"127.0.0.1:{broker.port}",
            "costPerMiB": 8,
            "budget": {"bytes": 10, "period": "day"},
        },
    )
    lanes = await linked_lanes(entries, BASE, ["$upstream/0", "$upstream/1"], store=None, data_dir=tmp_path, env={})
    try:
        assert [lane.endpoint_id for lane in lanes] == ["$upstream/0", "$upstream/1"]
        for lane in lanes:
            assert isinstance(lane, LinkedUpstream)
            async with asyncio.timeout(20):
                for t in lane.transports:
                    assert isinstance(t, MqttUpstream)
                    await t.wait_connected()
            ids = sorted(t.settings.client_id for t in lane.transports if isinstance(t, MqttUpstream))
            assert ids == sorted([f"gw-17-p{lane.endpoint_id[-1]}", f"gw-17-sat-p{lane.endpoint_id[-1]}"])
    finally:
        for lane in lanes:
            await lane.close()
    assert (tmp_path / BUDGET_FILE).exists()  # written at close, the lanes sharing one ledger
