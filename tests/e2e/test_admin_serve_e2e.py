"""The admin API as the composition root serves it (``serve`` with ``HubConfig.admin_port``): the port file while
it runs, the upstream lane in ``/status`` and ``/metrics`` with a real Mosquitto upstream, and the port file gone
after the stop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgehub.core import Identity
from edgehub.runtime.admin.client import running_hub
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.store import open_identities, open_store
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, WireMode
from tests.e2e.serving import serving, status_until
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


async def test_the_running_hub_shows_its_uplink_in_status_and_metrics(tmp_path: Path) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"up": "FROM /messages/* INTO $upstream"}}))
    store = open_store(data)
    await open_identities(store, "localhost", data_dir=data).set_password(Identity.parse("dev1"), b"pw")
    await store.close()
    async with MosquittoPeer(tmp_path) as broker:
        upstream = MqttUpstreamSettings(
            host="127.0.0.1", port=broker.port, client_id="gw", hub_id="gw", wire_mode=WireMode.MESSAGE, linger_s=0.0
        )
        config = HubConfig(
            manifest=manifest, data_dir=data, mqtt_port=0, mqtts_port=None, upstream=upstream, admin_port=0
        )
        async with serving(config, timeout_s=20) as ready:
            client = await asyncio.to_thread(running_hub, data)
            assert client is not None
            assert client.port == ready["admin"]
            device = Paho.make("dev1")
            assert await device.connect(ready["tcp"], user="dev1", password="pw") == 0
            for i in range(2):
                device.publish("devices/dev1/messages/events/", f"m{i}".encode())
            async with asyncio.timeout(20):
                # Acknowledged, and committed (the executor counts a batch in messages_sent before it commits it).
                status = await status_until(
                    client,
                    lambda s: (
                        s["upstream"]
                        and s["upstream"][0]["messages_acked"] == 2
                        and all(q["length"] == 0 for q in s["queues"] if q["endpoint"] == "$upstream")
                    ),
                )
            await device.close()
            (lane,) = status["upstream"]
            assert lane["endpoint"] == "$upstream"
            assert lane["connected"] is True
            assert lane["rate_bps"] is not None
            assert status["connected_clients"] == 1  # asked while the device was connected
            code, raw = await asyncio.to_thread(client.raw, "GET", "/metrics")
            assert code == 200
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(raw.decode())
                for s in family.samples
            }
            assert samples[("edgehub_messages_sent_total", (("to", "$upstream"), ("to_route_input", "")))] == 2
            assert samples[("edgehub_upstream_connected", (("lane", "$upstream"),))] == 1
            assert samples[("edgehub_messages_received_total", (("id", "dev1"),))] == 2
    assert not (data / "admin.port").exists()
    assert (data / "admin.token").exists()
