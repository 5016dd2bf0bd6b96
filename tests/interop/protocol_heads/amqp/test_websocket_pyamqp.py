"""AMQP over a WebSocket (subprotocol ``AMQPWSB10``, path ``/$iothub/websocket``) with a foreign client: the
pure-Python AMQP stack inside Azure's ``azure-eventhub`` (``_pyamqp``), on its own WebSocket transport
(``TransportType.AmqpOverWebsocket``, over websocket-client), logging in with a SAS token on ``$cbs``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from azure.eventhub._pyamqp.message import Message, Properties

from edgehub.core import SystemProperty
from edgehub.testing import InMemoryHub
from edgehub.testing.certs import TestCA
from protocol_heads.amqp import AmqpServer, AmqpSettings
from protocol_heads.websocket import SUBPROTOCOL_AMQP, WebSocketServer, WebSocketSettings
from tests.interop.protocol_heads.amqp.pyamqp_client import pyamqp_sender
from tests.protocol_heads.amqp.conftest import DEV, DEVICE_KEY, HOST, sas_token, server_context

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


@pytest.fixture
async def wss(hub: InMemoryHub, ca: TestCA) -> AsyncIterator[WebSocketServer]:
    context = server_context(ca)
    async with AmqpServer(hub, settings=AmqpSettings(tls_port=None, connect_timeout_s=5.0)) as amqp:
        settings = WebSocketSettings(tls_port=0, ssl_context=context)
        async with WebSocketServer(hub, settings=settings, heads={SUBPROTOCOL_AMQP: amqp}) as ws:
            yield ws


async def test_pyamqp_over_a_websocket_sends_telemetry_with_a_cbs_sas_token(
    wss: WebSocketServer, hub: InMemoryHub, ca: TestCA
) -> None:
    client = pyamqp_sender(
        wss.ports["wss"], ca.ca_pem, sas_token(DEV, DEVICE_KEY), host_name=HOST, device_id="dev1", websocket=True
    )

    def send() -> None:
        client.open()
        try:
            message = Message(data=[b"over a websocket"], properties=Properties(message_id="ws-1"))
            client.send_message(message, timeout=10)
        finally:
            client.close()

    await asyncio.wait_for(asyncio.to_thread(send), 30)
    [(_, stored)] = hub.stored
    assert stored.body == b"over a websocket"
    assert stored.system_properties[SystemProperty.MESSAGE_ID] == "ws-1"
    assert stored.system_properties[SystemProperty.CONNECTION_AUTH_METHOD] == "sas"
