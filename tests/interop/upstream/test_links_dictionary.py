"""A lane's links share one zstd dictionary, each link a far side of its own: built as the hub builds them
(``build_linked_lanes``), over two link simulators to one Mosquitto. The cheap link trains the dictionary on the
lane's telemetry and sends it once; when it is cut, the metered link's first alarm goes as plain zstd with the
dictionary behind it (once), and every alarm after is compressed with the dictionary the metered link never had
traffic enough to train. A restart from the same store sends it on neither link again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.core import Message
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.runtime.compose.links import build_linked_lanes
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.links import LinkedUpstream
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.segment import Codec, decode_segment, dictionary_id, segment_dictionary_id
from tests.upstream.test_dictionary import telemetry_batch

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def metered(broker: MosquittoPeer) -> AsyncIterator[LinkSim]:
    async with LinkSim(target_host=broker.host, target_port=broker.port) as sim:
        yield sim


def build(store: Store, tmp_path: Path, cheap: LinkSim, metered: LinkSim) -> LinkedUpstream:
    base = MqttUpstreamSettings(
        host="127.0.0.1", client_id="hub1", hub_id="hub1", compression=Codec.ZSTD, reconnect_min_s=0.1
    )
    links = [
        {"name": "cell", "address": f"127.0.0.1:{cheap.port}", "keepaliveSecs": 1, "settleSecs": 60},
        {"name": "sat", "address": f"127.0.0.1:{metered.port}", "costPerMiB": 8, "priorities": "0-1"},
    ]
    (lane,) = build_linked_lanes(links, base, ["$upstream"], store=store, data_dir=tmp_path)
    return lane


def alarm(i: int) -> list[QueuedMessage]:
    msg = Message(
        body=b'{"alarm":"pressure","pump":"pump-3"}',
        properties={"seq": str(i)},
        system_properties={"edgeMessageId": f"alarm-{i:08d}", "connectionDeviceId": "pump"},
    )
    return [QueuedMessage(message=msg, offset=i, priority=0, enqueued_at_s=1.79e9 + i, ttl_s=3600)]


def transports(lane: LinkedUpstream) -> tuple[MqttUpstream, MqttUpstream]:
    cell, sat = lane.transports
    assert isinstance(cell, MqttUpstream)
    assert isinstance(sat, MqttUpstream)
    return cell, sat


async def test_the_metered_link_compresses_with_the_dictionary_the_lane_trained_and_sends_it_once(
    broker: MosquittoPeer, link: LinkSim, metered: LinkSim, tmp_path: Path
) -> None:
    store = open_rocks_store(tmp_path / "db")
    lane = build(store, tmp_path, link, metered)
    cell, sat = transports(lane)
    ld = cell.dictionary
    assert ld is not None
    assert sat.dictionary is ld
    async with (
        asyncio.timeout(60),
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
        lane,
    ):
        await cell.wait_connected()
        await sat.wait_connected()
        offset = 0
        while ld.usable_at(None) is None:  # telemetry over the cheap link trains it; its PUBACK makes it usable
            assert (await lane.send(telemetry_batch(offset, 40))).succeeded
            offset += 40
        trained = ld.usable_at(None)
        assert trained is not None
        assert ld.usable_at("sat") is None  # the metered link's far side has not had it
        assert metered.stats.up_bytes < len(trained.data)  # ...and nothing of it went over the metered link
        link.cut()
        await lane.wait_for(lambda: not cell.connected)
        sat_before = metered.stats.up_bytes
        sent = 0
        while ld.usable_at("sat") is None:  # plain until the metered link's PUBACK of the dictionary is in
            assert sent < 20
            assert (await lane.send(alarm(sent))).succeeded
            sent += 1
        plain = sent
        for _ in range(4):
            assert (await lane.send(alarm(sent))).succeeded
            sent += 1
        assert metered.stats.up_bytes - sat_before > len(trained.data)  # the dictionary crossed it, once
        await sink.wait_for(offset // 40 + 2 + sent)
    await store.close()

    dicts = [m.payload for m in sink.messages if dictionary_id(m.payload) is not None]
    assert [dictionary_id(d) for d in dicts] == [trained.dict_id, trained.dict_id]  # one per far side
    alarms = [m.payload for m in sink.messages if "/p00/" in m.topic]
    used = [segment_dictionary_id(p) for p in alarms]
    assert 1 <= plain <= 3  # the first went plain (the dictionary behind it), and those before its PUBACK
    assert used == [0] * plain + [trained.dict_id] * 4
    known = {trained.dict_id: trained.data}
    bodies = [r.properties["seq"] for p in alarms for r in decode_segment(p, known)]
    assert bodies == [str(i) for i in range(sent)]
    assert max(len(p) for p in alarms[plain:]) < len(alarms[0]) * 0.7  # what sharing it buys on the metered link

    # A restart from the same store: both far sides are known to have it, neither gets it again.
    store = open_rocks_store(tmp_path / "db")
    lane = build(store, tmp_path, link, metered)
    cell, sat = transports(lane)
    assert cell.dictionary is not None
    remembered = cell.dictionary.usable_at("sat")
    assert remembered is not None
    assert remembered.dict_id == trained.dict_id
    before = len(sink.messages)
    async with asyncio.timeout(30), MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink, lane:
        await sat.wait_connected()
        assert (await lane.send(alarm(sent))).succeeded
        await sink.wait_for(1)
        await asyncio.sleep(0.5)
    await store.close()
    assert before > 0
    assert [segment_dictionary_id(m.payload) for m in sink.messages] == [trained.dict_id]
