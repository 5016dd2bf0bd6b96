"""``MqttServer.close_identity``: an identity whose credentials were removed or rotated loses its connection at
once, and a login that was checking those credentials at that moment checks them again (paho on 127.0.0.1,
``InMemoryHub`` with its login gate)."""

from __future__ import annotations

import asyncio

from paho.mqtt.enums import MQTTProtocolVersion

from edgehub.testing import InMemoryHub
from protocol_heads.mqtt.server import MqttServer
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, Paho, sas_password, username


async def test_closing_an_identity_disconnects_its_mqtt5_client_with_administrative_action(
    head: MqttServer, hub: InMemoryHub
) -> None:
    client = Paho.make(DEV.id, protocol=MQTTProtocolVersion.MQTTv5)
    rc = await client.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    try:
        assert not rc.is_failure
        assert head.close_identity(DEV.id) == 1
        async with asyncio.timeout(5):
            reason = await client.disconnects.get()
            await hub.wait_disconnected(DEV)
        assert reason.value == 0x98
        assert head.connected == []
        assert head.close_identity(DEV.id) == 0  # nothing left to close
    finally:
        await client.close()


async def test_a_login_that_overlaps_a_revocation_checks_the_credentials_again(
    head: MqttServer, hub: InMemoryHub
) -> None:
    hub.hold_logins()
    client = Paho.make(DEV.id)
    login = asyncio.ensure_future(
        client.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    )
    try:
        async with asyncio.timeout(10):
            await hub.wait_login_held()  # the credentials were found valid; the answer is not out yet
        hub.remove_identity(DEV)
        assert head.close_identity(DEV.id) == 0  # not registered yet: nothing to close
        hub.release_logins()
        async with asyncio.timeout(10):
            rc = await login
        assert rc.is_failure  # checked again after the revocation: refused, never registered
        assert head.connected == []
    finally:
        login.cancel()
        await client.close()
