"""``edgehub run --log-format json`` as journald or a shipper reads it: every line it writes to stderr is one JSON
object, and a device refused for bad credentials is one of them, with the reason, the peer and the client id."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from edgehub.runtime.cli.app import DEFAULT_MANIFEST
from tests.e2e.hub_process import start
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


async def test_json_logs_are_one_object_a_line_and_a_refusal_names_reason_and_client(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, port, _ = await start(data, DEFAULT_MANIFEST, "--log-format", "json", "--no-upstream")
    intruder = Paho.make("dev7", protocol=mqtt.MQTTv5)
    user = "localhost/dev7/?api-version=2021-04-12"
    rc = await intruder.connect(port, tls_ca=data / "certs" / "ca.pem", user=user, password="not a token")
    assert rc != 0
    await intruder.close()
    proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 0
    docs = [json.loads(line) for line in err.decode().splitlines()]  # every line parses
    events = [d["event"] for d in docs]
    assert "runtime.ready" in events
    assert "runtime.stopped" in events
    [refusal] = [d for d in docs if d["event"] == "refused"]
    assert refusal["client"] == "dev7"
    assert refusal["reason"] in ("bad_credentials", "not_authorized")
    assert refusal["peer"].startswith("127.0.0.1")
    assert refusal["level"] == "INFO"
