"""The AMQP head's logins and links: CBS tokens and their expiry, ACLs on addresses, module inputs and their
settlement as the checkpoint, redelivery after a reconnect."""

from __future__ import annotations

import asyncio
import hashlib
import ssl

import pytest
from proton import Message as AmqpMessage
from proton.utils import LinkDetached

from edgehub.core import Identity, Message
from edgehub.testing import InMemoryHub
from edgehub.testing.certs import TestCA
from edgehub.testing.clock import ManualClock
from protocol_heads.amqp import AmqpServer, AmqpSettings
from tests.protocol_heads.amqp.conftest import (
    DEV,
    DEVICE_KEY,
    HOST,
    MOD,
    MODULE_KEY,
    ProtonClient,
    accept,
    put_token,
    receive,
    sas_token,
)

pytestmark = pytest.mark.interop


async def test_anonymous_client_logs_in_with_a_cbs_token_then_sends(head: AmqpServer, hub: InMemoryHub) -> None:
    client = await ProtonClient.connect(head.ports["amqp"], mechs="ANONYMOUS")
    try:
        answer = await put_token(client, f"{HOST}/devices/dev1", sas_token(DEV, DEVICE_KEY))
        assert answer.properties["status-code"] == 200
        assert answer.correlation_id == "req-1"
        sender = await client.sender("/devices/dev1/messages/events")
        await client.send(sender, AmqpMessage(body=b"after cbs"))
        assert [m.body for _, m in hub.stored] == [b"after cbs"]
    finally:
        await client.close()


async def test_a_bad_cbs_token_gets_401_and_no_telemetry_link(head: AmqpServer, hub: InMemoryHub) -> None:
    client = await ProtonClient.connect(head.ports["amqp"], mechs="ANONYMOUS")
    try:
        answer = await put_token(client, f"{HOST}/devices/dev1", sas_token(DEV, MODULE_KEY))
        assert answer.properties["status-code"] == 401
        with pytest.raises(LinkDetached):
            await client.sender("/devices/dev1/messages/events")
    finally:
        await client.close()


async def test_a_device_cannot_send_as_another(head: AmqpServer, hub: InMemoryHub, ca: TestCA) -> None:
    client = await ProtonClient.connect(
        head.ports["amqps"], ca=ca.ca_pem, user=f"dev1@sas.{HOST}", password=sas_token(DEV, DEVICE_KEY)
    )
    try:
        with pytest.raises(LinkDetached):
            await client.sender("/devices/dev2/messages/events")
        with pytest.raises(LinkDetached):
            await client.sender("/devices/dev1/modules/filter/messages/events")
        assert hub.stored == []
    finally:
        await client.close()


async def test_connection_whose_cbs_token_expires_without_renewal_is_closed(ca: TestCA) -> None:
    clock = ManualClock(start=1_700_000_000.0)
    hub = InMemoryHub(host_name=HOST, clock=clock)
    hub.add_identity(DEV, key_b64=DEVICE_KEY)
    settings = AmqpSettings(tcp_port=0, tls_port=None, clock=clock)
    async with AmqpServer(hub, settings=settings) as head:
        client = await ProtonClient.connect(head.ports["amqp"], mechs="ANONYMOUS")
        try:
            expiry = int(clock.time()) + 60
            answer = await put_token(client, f"{HOST}/devices/dev1", sas_token(DEV, DEVICE_KEY, expiry_s=expiry))
            assert answer.properties["status-code"] == 200
            assert head.connected == ["dev1"]
            clock.advance(61)
            async with asyncio.timeout(10):
                await hub.wait_disconnected(DEV)
            assert head.connected == []
            assert head.refusals.total == 1  # the token_expired line
        finally:
            await client.close()


async def test_module_receives_inputs_and_its_settlement_is_the_checkpoint(head: AmqpServer, hub: InMemoryHub) -> None:
    hub.enqueue(MOD, "in1", Message(b"first", {"k": "v"}, {"messageId": "a", "connectionDeviceId": "dev2"}))
    client = await ProtonClient.connect(
        head.ports["amqp"], user=f"dev1/filter@sas.{HOST}", password=sas_token(MOD, MODULE_KEY)
    )
    try:
        receiver = await client.receiver("/devices/dev1/modules/filter/messages/events", credit=5)
        got = await receive(receiver)
        assert got.body == b"first"
        assert got.annotations["x-opt-input-name"] == "in1"
        assert got.annotations["iothub-connection-device-id"] == "dev2"
        assert got.properties == {"k": "v"}
        assert got.id == "a"
        assert hub.acked == []  # not settled yet: not delivered
        await accept(receiver)
        await client.pump_until(lambda: len(hub.acked) >= 1)
        assert hub.acked[0][2] is True
    finally:
        await client.close()


async def test_unsettled_input_is_redelivered_after_reconnect(head: AmqpServer, hub: InMemoryHub) -> None:
    hub.enqueue(MOD, "in1", Message(b"again"))
    password = sas_token(MOD, MODULE_KEY)
    client = await ProtonClient.connect(head.ports["amqp"], user=f"dev1/filter@sas.{HOST}", password=password)
    receiver = await client.receiver("/devices/dev1/modules/filter/messages/events", credit=5)
    assert (await receive(receiver)).body == b"again"
    await client.close()  # without settling
    async with asyncio.timeout(10):
        await hub.wait_disconnected(MOD)
    client = await ProtonClient.connect(head.ports["amqp"], user=f"dev1/filter@sas.{HOST}", password=password)
    try:
        receiver = await client.receiver("/devices/dev1/modules/filter/messages/events", credit=5)
        again = await receive(receiver)
        assert again.body == b"again"
        assert again.delivery_count == 1
        await accept(receiver)
        await client.pump_until(lambda: len(hub.acked) >= 1)
        assert hub.pending(MOD) == 0
    finally:
        await client.close()


async def test_sasl_external_logs_in_with_the_tls_client_certificate(head: AmqpServer, ca: TestCA) -> None:
    pair = ca.client("certdev")
    der = ssl.PEM_cert_to_DER_cert(pair.cert.read_text())
    hub = head.hub
    assert isinstance(hub, InMemoryHub)
    hub.add_identity(Identity.parse("certdev"), thumbprint=hashlib.sha256(der).hexdigest())
    client = await ProtonClient.connect(head.ports["amqps"], ca=ca.ca_pem, mechs="EXTERNAL", cert=(pair.cert, pair.key))
    try:
        sender = await client.sender("/devices/certdev/messages/events")
        await client.send(sender, AmqpMessage(body=b"by cert"))
        [(who, stored)] = hub.stored
        assert who == Identity.parse("certdev")
        assert stored.system_properties["connectionAuthMethod"] == "x509"
    finally:
        await client.close()
