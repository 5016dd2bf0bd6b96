"""The MQTT upstream with zstd: it trains its lane's dictionary, sends it once, and compresses with it only after
the broker acknowledged it; a restart reuses the dictionary kept in the store and does not send it again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.segment import Codec, decode_segment, dictionary_id, segment_dictionary_id
from tests.upstream.test_dictionary import telemetry_batch

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_rocks_store(tmp_path / "db")
    yield s
    await s.close()


def _settings(link: LinkSim) -> MqttUpstreamSettings:
    return MqttUpstreamSettings(
        host="127.0.0.1", port=link.port, client_id="hub1", hub_id="hub1", compression=Codec.ZSTD, compresslevel=19
    )


async def test_the_dictionary_goes_once_and_before_every_segment_that_uses_it(
    broker: MosquittoPeer, link: LinkSim, store: Store
) -> None:
    async with (
        asyncio.timeout(40),
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
        MqttUpstream(_settings(link), keeper=store) as up,
    ):
        await up.wait_connected()
        ld = up.dictionary
        assert ld is not None
        offset = 0
        while ld.usable is None:  # each send samples the lane; training and the dictionary's PUBACK follow
            assert (await up.send(telemetry_batch(offset, 40))).succeeded
            offset += 40
        for _ in range(5):
            assert (await up.send(telemetry_batch(offset, 40))).succeeded
            offset += 40
        await sink.wait_for(1 + offset // 40)
        kinds = [dictionary_id(m.payload) for m in sink.messages]
        dict_ids = [k for k in kinds if k is not None]
        assert dict_ids == [ld.usable.dict_id]  # sent once
        dictionary = sink.messages[kinds.index(dict_ids[0])].payload
        assert sink.messages[kinds.index(dict_ids[0])].topic == "edgehub/segments/hub1/upstream/dict"
        segments = [m.payload for m in sink.messages if dictionary_id(m.payload) is None]
        using = [i for i, seg in enumerate(segments) if segment_dictionary_id(seg) == dict_ids[0]]
        assert len(using) >= 5
        assert kinds.index(dict_ids[0]) < [i for i, k in enumerate(kinds) if k is None][using[0]]
        got = [r.edge_message_id for seg in segments for r in decode_segment(seg, {dict_ids[0]: dictionary})]
        assert got == [f"{i:032x}" for i in range(offset)]

    # A restart: the dictionary comes from the store, announced; it is used at once and not sent again.
    async with (
        asyncio.timeout(20),
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
        MqttUpstream(_settings(link), keeper=store) as up,
    ):
        await up.wait_connected()
        assert (await up.send(telemetry_batch(offset, 40))).succeeded
        await sink.wait_for(1)
        assert [dictionary_id(m.payload) for m in sink.messages] == [None]
        assert segment_dictionary_id(sink.messages[0].payload) == dict_ids[0]


async def test_zstd_without_dictionaries_stays_plain_zstd(broker: MosquittoPeer, link: LinkSim) -> None:
    settings = MqttUpstreamSettings(
        host="127.0.0.1", port=link.port, client_id="hub1", hub_id="hub1", compression=Codec.ZSTD, zstd_dictionary=False
    )
    async with (
        asyncio.timeout(30),
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
        MqttUpstream(settings) as up,
    ):
        await up.wait_connected()
        assert up.dictionary is None
        for b in range(12):
            assert (await up.send(telemetry_batch(b * 40, 40))).succeeded
        await sink.wait_for(12)
        assert all(dictionary_id(m.payload) is None for m in sink.messages)
        assert all(segment_dictionary_id(m.payload) == 0 for m in sink.messages)
