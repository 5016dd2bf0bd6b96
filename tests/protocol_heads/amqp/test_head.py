"""The AMQP head end to end with proton's own client: login, telemetry settled after storage, refusals."""

from __future__ import annotations

import asyncio

import pytest
from proton import Disposition, Endpoint
from proton import Message as AmqpMessage
from proton.utils import SendException

from edgehub.core import SystemProperty
from edgehub.core.refusals import RefusalReason
from edgehub.testing import InMemoryHub
from edgehub.testing.certs import TestCA
from protocol_heads.amqp import AmqpServer
from tests.protocol_heads.amqp.conftest import DEV, DEVICE_KEY, HOST, EngineClient, ProtonClient, sas_token

pytestmark = pytest.mark.interop


async def test_device_over_tls_with_sasl_plain_sas_sends_telemetry_settled_after_storage(
    head: AmqpServer, hub: InMemoryHub, ca: TestCA
) -> None:
    client = await ProtonClient.connect(
        head.ports["amqps"], ca=ca.ca_pem, user=f"dev1@sas.{HOST}", password=sas_token(DEV, DEVICE_KEY)
    )
    try:
        sender = await client.sender("/devices/dev1/messages/events")
        hub.hold()  # not durable yet: the transfer must stay unsettled
        msg = AmqpMessage(body=b'{"t": 21.5}', id="m-1", content_type="application/json", group_id="ship-7")
        msg.properties = {"room": "engine"}
        msg.annotations = {"x-opt-partition-key": "ship-7"}
        sending = asyncio.create_task(client.send(sender, msg))
        await hub.wait_held(1)
        assert not sending.done()
        assert hub.stored == []
        hub.release()
        async with asyncio.timeout(10):
            await sending
        stored = hub.stored[0][1]
        assert stored.body == b'{"t": 21.5}'
        sp = stored.system_properties
        assert sp[SystemProperty.MESSAGE_ID] == "m-1"
        assert sp[SystemProperty.CONTENT_TYPE] == "application/json"
        assert sp[SystemProperty.SESSION_ID] == "ship-7"
        assert sp[SystemProperty.PARTITION_KEY] == "ship-7"
        assert sp[SystemProperty.CONNECTION_DEVICE_ID] == "dev1"
        assert sp[SystemProperty.CONNECTION_AUTH_METHOD] == "sas"
        assert stored.properties == {"room": "engine"}
    finally:
        await client.close()


async def test_refused_message_is_rejected_with_the_quota_condition(
    head: AmqpServer, hub: InMemoryHub, ca: TestCA
) -> None:
    client = await ProtonClient.connect(
        head.ports["amqps"], ca=ca.ca_pem, user=f"dev1@sas.{HOST}", password=sas_token(DEV, DEVICE_KEY)
    )
    try:
        sender = await client.sender("/devices/dev1/messages/events")
        hub.refuse(RefusalReason.QUOTA_EXCEEDED)
        with pytest.raises(SendException) as info:
            await client.send(sender, AmqpMessage(body=b"x"))
        assert info.value.state == Disposition.REJECTED
        assert hub.stored == []
        await client.send(sender, AmqpMessage(body=b"y"))
        assert [m.body for _, m in hub.stored] == [b"y"]
    finally:
        await client.close()


async def test_a_transfer_stays_unsettled_until_the_hub_has_stored_it(head: AmqpServer, hub: InMemoryHub) -> None:
    client = await EngineClient.connect(head.ports["amqp"], f"dev1@sas.{HOST}", sas_token(DEV, DEVICE_KEY))
    try:
        link = client.sender("/devices/dev1/messages/events", "telemetry")
        await client.pump_until(lambda: link.credit > 0)
        hub.hold()
        delivery = link.delivery("1")
        link.send(AmqpMessage(body=b"held").encode())
        link.advance()
        await client.pump_until(lambda: True)  # written
        await hub.wait_held(1)
        # A barrier: the hub answers a second link's attach after anything it said before it, in order.
        barrier = client.sender("/devices/dev1/messages/events", "barrier")
        await client.pump_until(lambda: bool(barrier.state & Endpoint.REMOTE_ACTIVE))
        assert not delivery.settled  # nothing stored yet: not settled
        hub.release()
        await client.pump_until(lambda: delivery.settled)
        assert delivery.remote_state == Disposition.ACCEPTED
        assert [m.body for _, m in hub.stored] == [b"held"]
    finally:
        await client.close()
