"""What fuzzing found in the MQTT head, each pinned by a test."""

from __future__ import annotations

import asyncio
import logging
import struct

import pytest

from edgehub.core import Identity
from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import MQTT_50, MQTT_311, Connect, ProtocolViolation
from edgehub.testing import InMemoryHub
from protocol_heads.mqtt.connection import ConnectRequested, ProtocolFailed, ServerConnection
from protocol_heads.mqtt.server import MqttServer, MqttSettings


def _zero_id(first: int, rest: bytes, level: int) -> bytes:
    body = b"\x00\x00" + (b"\x00" if level == MQTT_50 and first >> 4 in (8, 10) else b"") + rest
    return bytes([first, len(body)]) + body


_FILTER = struct.pack("!H", 3) + b"a/b"
# Packets that carry a packet identifier, with identifier 0, which MQTT forbids [MQTT-2.2.1-3]: the server
# answers SUBSCRIBE, UNSUBSCRIBE and PUBREL with the same identifier, and cannot encode 0.
ZERO_ID = {
    "SUBSCRIBE": (0x82, _FILTER + b"\x01"),
    "UNSUBSCRIBE": (0xA2, _FILTER),
    "PUBREL": (0x62, b""),
    "PUBREC": (0x50, b""),
}


@pytest.mark.parametrize("level", [MQTT_311, MQTT_50])
@pytest.mark.parametrize("kind", sorted(ZERO_ID))
def test_packet_identifier_zero_is_a_protocol_violation(kind: str, level: int) -> None:
    first, rest = ZERO_ID[kind]
    with pytest.raises(ProtocolViolation, match="packet identifier 0"):
        Decoder(protocol_level=level).receive_data(_zero_id(first, rest, level))


@pytest.mark.parametrize("level", [MQTT_311, MQTT_50])
@pytest.mark.parametrize("kind", ["SUBSCRIBE", "UNSUBSCRIBE", "PUBREL"])
def test_a_client_using_packet_identifier_zero_fails_its_connection_instead_of_the_server(
    kind: str, level: int
) -> None:
    conn = ServerConnection()
    assert [type(e) for e in conn.receive_data(encode(Connect("c", level), level))] == [ConnectRequested]
    conn.accept()
    conn.data_to_send()
    first, rest = ZERO_ID[kind]
    events = conn.receive_data(_zero_id(first, rest, level))
    assert [type(e) for e in events] == [ProtocolFailed]
    assert conn.closed


async def test_the_head_closes_a_client_that_subscribes_with_packet_identifier_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub = InMemoryHub()
    hub.add_identity(Identity.parse("plain"), password=b"secret")
    settings = MqttSettings(tcp_port=0, tls_port=None, connect_timeout_s=5.0)
    async with MqttServer(hub, settings=settings) as head:
        reader, writer = await asyncio.open_connection("127.0.0.1", head.ports["tcp"])
        writer.write(encode(Connect("plain", username="plain", password=b"secret"), MQTT_311))
        async with asyncio.timeout(10):
            assert await reader.readexactly(4) == b"\x20\x02\x00\x00"
            writer.write(_zero_id(*ZERO_ID["SUBSCRIBE"], MQTT_311))
            assert await reader.read() == b""  # closed, no SUBACK
        writer.close()
        await writer.wait_closed()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
