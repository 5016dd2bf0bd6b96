"""``AmqpServer.close_identity`` (``HeadServer``'s, as the MQTT head's): an identity whose credentials were removed
or rotated loses its AMQP connection at once, closed with ``amqp:unauthorized-access``, and a login that was
checking those credentials at that moment checks them again (proton's client on 127.0.0.1, ``InMemoryHub`` with
its login gate)."""

from __future__ import annotations

import asyncio

import pytest
from proton import ConnectionException
from proton.utils import ConnectionClosed

from edgehub.testing import InMemoryHub
from protocol_heads.amqp import AmqpServer
from tests.protocol_heads.amqp.conftest import DEV, DEVICE_KEY, HOST, ProtonClient, sas_token

pytestmark = pytest.mark.interop


async def device(port: int) -> ProtonClient:
    return await ProtonClient.connect(port, user=f"dev1@sas.{HOST}", password=sas_token(DEV, DEVICE_KEY))


async def test_closing_an_identity_closes_its_amqp_connection_with_unauthorized_access(
    head: AmqpServer, hub: InMemoryHub
) -> None:
    client = await device(head.ports["amqp"])
    try:
        await client.sender("/devices/dev1/messages/events")
        assert head.connected == [DEV.id]
        assert head.close_identity(DEV.id) == 1
        with pytest.raises(ConnectionClosed) as closed:
            await client.pump_until(lambda: False)
        assert closed.value.condition == "amqp:unauthorized-access"
        async with asyncio.timeout(5):
            await hub.wait_disconnected(DEV)
        assert head.connected == []
        assert head.close_identity(DEV.id) == 0  # nothing left to close
    finally:
        await client.close()


async def test_an_amqp_login_that_overlaps_a_revocation_checks_the_credentials_again(
    head: AmqpServer, hub: InMemoryHub
) -> None:
    hub.hold_logins()
    login = asyncio.ensure_future(device(head.ports["amqp"]))
    try:
        async with asyncio.timeout(10):
            await hub.wait_login_held()  # the credentials were found valid; the answer is not out yet
        hub.remove_identity(DEV)
        assert head.close_identity(DEV.id) == 0  # not registered yet: nothing to close
        hub.release_logins()
        with pytest.raises(ConnectionException):  # checked again after the revocation: refused
            await login
        assert head.connected == []
    finally:
        if not login.done():
            hub.release_logins()
            await asyncio.wait({login}, timeout=10)
