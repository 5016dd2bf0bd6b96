"""The MQTT upstream against a real Mosquitto that announces a Maximum Packet Size (``max_packet_size``), as MQTT 5
lets a broker do and as Mosquitto enforces (a larger packet from a client loses it the connection): the hub cuts its
segments to fit, refuses alone the one message that cannot fit, keeps the connection, and does not send a zstd
dictionary over the limit (segments stay plain zstd)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.core import Message
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttProtocol, MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.segment import Codec, decode_segment, dictionary_id, segment_dictionary_id
from tests.upstream.test_dictionary import telemetry_batch

pytestmark = pytest.mark.timeout(60)

LIMIT = 2048  # below the 4 KB dictionary a lane trains


@pytest.fixture
async def small_broker(tmp_path: Path) -> AsyncIterator[MosquittoPeer]:
    async with MosquittoPeer(tmp_path, extra_config=[f"max_packet_size {LIMIT}"]) as peer:
        yield peer


async def test_segments_fit_the_brokers_maximum_packet_size_and_a_message_over_it_is_refused_alone(
    small_broker: MosquittoPeer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edgehub.upstream")
    settings = MqttUpstreamSettings(
        host=small_broker.host,
        port=small_broker.port,
        client_id="hub1",
        hub_id="hub1",
        protocol=MqttProtocol.V5,
        compression=Codec.ZSTD,
        max_batch_bytes=16_384,  # segments would be up to 16 KiB but for the broker's limit
    )
    async with (
        asyncio.timeout(45),
        MqttCollector(host=small_broker.host, port=small_broker.port, topic="edgehub/#") as sink,
        MqttUpstream(settings) as up,
    ):
        await up.wait_connected()
        ld = up.dictionary
        assert ld is not None
        offset = publishes = 0
        while ld.pending is None:  # the lane samples its segments until it has trained a dictionary
            result = await up.send(telemetry_batch(offset, 100))
            assert len(result.succeeded) == 100
            offset += 100
            publishes += int(result.details["publishes"])
        for _ in range(3):  # the trained dictionary is over the limit: never sent, so never used
            result = await up.send(telemetry_batch(offset, 100))
            assert len(result.succeeded) == 100
            offset += 100
            publishes += int(result.details["publishes"])
        assert ld.usable is None
        too_large = [r for r in caplog.records if r.getMessage().startswith("upstream.dictionary_too_large")]
        assert len(too_large) == 1  # said once

        big = QueuedMessage(
            message=Message(body=os.urandom(3000)), offset=offset, priority=5, enqueued_at_s=1.79e9, ttl_s=3600
        )
        result = await up.send([*telemetry_batch(offset + 1, 20), big])
        assert sorted(q.offset for q in result.succeeded) == list(range(offset + 1, offset + 21))
        assert [q.offset for q in result.invalid] == [offset]
        assert result.error is not None
        assert f"over the broker's Maximum Packet Size of {LIMIT}" in result.error
        assert up.connected
        assert up.status().offline_count == 0  # the broker never closed the connection
        publishes += int(result.details["publishes"]) - 1  # the refused message's PUBLISH was not written

        expected = [f"{i:032x}" for i in range(offset)] + [f"{i:032x}" for i in range(offset + 1, offset + 21)]
        await sink.wait_for(publishes)
        assert all(dictionary_id(m.payload) is None for m in sink.messages)
        assert all(segment_dictionary_id(m.payload) == 0 for m in sink.messages)
        assert max(len(m.payload) for m in sink.messages) < LIMIT
        assert [r.edge_message_id for m in sink.messages for r in decode_segment(m.payload)] == expected
