"""The MQTT head stopping (SIGTERM to ``edgehub run``): a message whose write is in flight when the stop begins is
still acknowledged, and then an MQTT 5 client is told why the connection ends (DISCONNECT 0x8B "server shutting
down"); a 3.1.1 client, which has no server DISCONNECT, sees the socket close after its PUBACK."""

from __future__ import annotations

import asyncio

import pytest

from edgehub.mqtt.packets import MQTT_50, ConnAck, Disconnect, PubAck, Publish, ReasonCode
from edgehub.testing import InMemoryHub
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.mqtt.rawclient import RawClient
from tests.protocol_heads.mqtt.test_hostile import dev_connect, polled


@pytest.mark.parametrize("level", [MQTT_50, 4])
async def test_a_stopping_server_acks_the_write_in_flight_then_says_it_is_shutting_down(
    hub: InMemoryHub, level: int
) -> None:
    server = MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None))
    await server.__aenter__()
    stopping: asyncio.Task[None] | None = None
    try:
        client = await RawClient.open(server.ports["tcp"], level=level)
        assert isinstance(await client.login(dev_connect(level)), ConnAck)
        hub.hold()
        client.send(Publish("devices/dev1/messages/events/", b"last words", 1, packet_id=7))
        await hub.wait_held(1)
        stopping = asyncio.create_task(server.__aexit__(None, None, None))
        await polled(lambda: server.stopping)  # the stop has begun: no accepts, every client task cancelled
        hub.release()
        assert await client.next() == PubAck(7)
        if level == MQTT_50:
            goodbye = await client.next()
            assert isinstance(goodbye, Disconnect)
            assert goodbye.reason_code == ReasonCode.SERVER_SHUTTING_DOWN
        assert await client.closed_by_server()
        await client.close()
    finally:
        hub.release()
        if stopping is None:
            await server.__aexit__(None, None, None)
        else:
            async with asyncio.timeout(10):
                await stopping
    assert [m.body for _, m in hub.stored] == [b"last words"]
