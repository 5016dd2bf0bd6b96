"""``edgehub run`` refuses at ingest what no routed endpoint can ever carry only when it can tell: with
``--no-amqp`` (modules connect over MQTT only) an MQTT 5 device's message whose properties make the module's
input topic longer than MQTT's 65,535 bytes gets PUBACK 0x83 and one ``refused reason=undeliverable`` line;
with AMQP served (an AMQP module could carry those properties) the same message is stored, as before."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import pytest
from paho.mqtt.enums import MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from tests.e2e.hub_process import identity_add, start
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

ROUTES = {"toFilter": "FROM /messages/* INTO BrokeredEndpoint('/modules/filter/inputs/in1')"}


@pytest.mark.parametrize(("extra", "code"), [(("--no-amqp",), 0x83), ((), 0x00)], ids=["mqtt-only", "with-amqp"])
async def test_a_message_no_module_could_be_sent_is_refused_only_when_modules_speak_mqtt_alone(
    tmp_path: Path, extra: tuple[str, ...], code: int
) -> None:
    data, manifest = tmp_path / "data", tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": ROUTES}))
    cs = await identity_add(data, "dev1")
    proc, port, _ = await start(data, manifest, *extra)
    dev = Paho.make("dev1", protocol=MQTTProtocolVersion.MQTTv5)
    try:
        user = f"{cs.host_name}/dev1/?api-version=2021-04-12"
        token = cs.sas_token(int(time.time()) + 3600)
        assert await dev.connect(port, tls_ca=data / "certs" / "ca.pem", user=user, password=token) == 0
        props = PahoProperties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.UserProperty = [(name, "é" * 20_000) for name in ("a", "b", "c")]
        mid = dev.publish("devices/dev1/messages/events/", b"big", qos=1, properties=props)
        async with asyncio.timeout(20):
            assert await dev.publishes.get() == (mid, code)
    finally:
        await dev.close()
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            _, err = await proc.communicate()  # the log is on stderr
    assert proc.returncode == 0
    refused = [line for line in err.decode().splitlines() if "reason=undeliverable" in line]
    assert len(refused) == (2 if code else 0), refused  # the hub's line (with why) and the head's (with its code)
