"""Interop with an AMQP 1.0 stack not built on proton: the pure-Python one inside Azure's ``azure-eventhub``
(``_pyamqp``, shared with ``azure-servicebus``), over TLS, logging in with a SAS token put on ``$cbs`` as the
Azure SDKs do."""

from __future__ import annotations

import asyncio

import pytest
from azure.eventhub._pyamqp.error import AMQPException
from azure.eventhub._pyamqp.message import Message, Properties

from edgehub.core import SystemProperty
from edgehub.core.refusals import RefusalReason
from edgehub.testing import InMemoryHub
from edgehub.testing.certs import TestCA
from protocol_heads.amqp import AmqpServer
from tests.interop.protocol_heads.amqp.pyamqp_client import pyamqp_sender
from tests.protocol_heads.amqp.conftest import DEV, DEVICE_KEY, HOST, sas_token

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


async def test_pyamqp_device_sends_telemetry_with_a_cbs_sas_token(
    head: AmqpServer, hub: InMemoryHub, ca: TestCA
) -> None:
    client = pyamqp_sender(head.ports["amqps"], ca.ca_pem, sas_token(DEV, DEVICE_KEY), host_name=HOST, device_id="dev1")

    def send() -> None:
        client.open()
        try:
            message = Message(data=[b"from pyamqp"], properties=Properties(message_id="py-1", correlation_id="c-1"))
            message = message._replace(application_properties={"site": "north"})
            client.send_message(message, timeout=10)
        finally:
            client.close()

    await asyncio.wait_for(asyncio.to_thread(send), 30)
    [(_, stored)] = hub.stored
    assert stored.body == b"from pyamqp"
    assert stored.system_properties[SystemProperty.MESSAGE_ID] == "py-1"
    assert stored.system_properties[SystemProperty.CORRELATION_ID] == "c-1"
    assert stored.system_properties[SystemProperty.CONNECTION_AUTH_METHOD] == "sas"
    assert stored.properties == {"site": "north"}


async def test_pyamqp_sees_a_refusal_as_an_error_with_its_condition(
    head: AmqpServer, hub: InMemoryHub, ca: TestCA
) -> None:
    client = pyamqp_sender(head.ports["amqps"], ca.ca_pem, sas_token(DEV, DEVICE_KEY), host_name=HOST, device_id="dev1")
    hub.refuse(RefusalReason.QUOTA_EXCEEDED)

    def send() -> str:
        client.open()
        try:
            client.send_message(Message(data=[b"refused"]), timeout=10)
        except AMQPException as exc:
            return str(exc.condition)
        finally:
            client.close()
        return "accepted"

    condition = await asyncio.wait_for(asyncio.to_thread(send), 30)
    assert condition == "ErrorCondition.ResourceLimitExceeded"  # amqp:resource-limit-exceeded, as pyamqp names it
    assert hub.stored == []
