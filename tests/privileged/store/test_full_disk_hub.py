"""The whole hub on a full disk, while devices publish over MQTT: it stays up, refuses what it cannot store (an MQTT
5 device gets a negative PUBACK with a reason, a 3.1.1 device is disconnected, as for every refusal), keeps
delivering what it holds to a connected module, and accepts again once there is room. Every message it
acknowledged reaches the module.

The disk is a real 8 MB tmpfs (``tests.store.fulldisk``) holding the hub's data folder, filled with a real file.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from edgehub.core import Identity
from edgehub.mqtt.packets import ReasonCode
from tests.e2e.conftest import DEV, FILTER, SENSOR, running_hub, sas, username
from tests.protocol_heads.mqtt.conftest import Paho
from tests.store.fulldisk import fill, small_disk

__all__ = ["small_disk"]  # the fixture, imported for use here

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

ROUTES = {"all": "FROM /messages/* INTO BrokeredEndpoint('/modules/filter/inputs/in1')"}
INPUTS = "devices/edge/modules/filter/inputs/"
BODY = b"x" * 2000


async def connected(port: int, identity: Identity, protocol: MQTTProtocolVersion) -> Paho:
    client = Paho.make(identity.id, protocol=protocol)
    assert await client.connect(port, user=username(identity), password=sas(identity)) == 0
    return client


async def publish(client: Paho, topic: str, payload: bytes) -> int:
    """One QoS 1 PUBLISH; its PUBACK reason code (MQTT 5), 0 for 3.1.1's PUBACK."""
    mid = client.publish(topic, payload)
    async with asyncio.timeout(10):
        got_mid, reason = await client.publishes.get()
    assert got_mid == mid
    return reason


async def test_hub_on_a_full_disk_refuses_with_a_reason_keeps_delivering_and_accepts_again_when_room_returns(
    small_disk: Path,
) -> None:
    topic = f"devices/{DEV.id}/messages/events/"
    acked: set[bytes] = set()
    async with running_hub(small_disk / "data", routes=ROUTES) as rig:
        dev = await connected(rig.tcp, DEV, MQTTProtocolVersion.MQTTv5)
        for i in range(20):  # held: no module is connected yet
            assert await publish(dev, topic, b"held %d " % i + BODY) == 0
            acked.add(b"held %d " % i + BODY)

        fill(small_disk / "filler")
        # the WAL's last page may still take a message or two; then the disk says no
        for i in range(200):
            payload = b"full %d " % i + BODY
            reason = await publish(dev, topic, payload)
            if reason:
                break
            acked.add(payload)
        assert reason == ReasonCode.QUOTA_EXCEEDED
        assert await publish(dev, topic, b"refused again " + BODY) == ReasonCode.QUOTA_EXCEEDED
        assert not dev.gone  # a refusal, not a disconnection

        old = await connected(rig.tcp, SENSOR, MQTTProtocolVersion.MQTTv311)
        old.publish(f"devices/{SENSOR.id}/messages/events/", b"from 3.1.1 " + BODY)
        async with asyncio.timeout(10):
            await old.disconnects.get()  # 3.1.1 has no negative PUBACK: the refusal is the disconnection
        await old.close()

        # the hub is up: a module connects and gets what the store held before the disk filled
        mod = await connected(rig.tcp, FILTER, MQTTProtocolVersion.MQTTv311)
        mod.client.subscribe(f"{INPUTS}#", qos=1)
        received: set[bytes] = set()
        async with asyncio.timeout(30):
            while not acked <= received:
                received.add(bytes((await mod.messages.get()).payload))

        (small_disk / "filler").unlink()
        async with asyncio.timeout(30):  # the store reopens read-write at the next write once there is room
            while await publish(dev, topic, b"probe " + BODY):
                pass
        acked.add(b"probe " + BODY)
        for i in range(20):
            assert await publish(dev, topic, b"after %d " % i + BODY) == 0
            acked.add(b"after %d " % i + BODY)
        async with asyncio.timeout(30):
            while not acked <= received:
                received.add(bytes((await mod.messages.get()).payload))
        await dev.close()
        await mod.close()
