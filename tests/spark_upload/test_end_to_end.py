"""From the hub's MQTT upstream to the lake: MqttUpstream (batch mode) -> Mosquitto -> Receiver -> the job.

Nothing here is a stand-in: the transport the hub runs publishes segments on its own topic, a real broker
carries them, the landing receiver subscribes with its default filter and lands them, and the job reads the
landing zone into bronze, where every message must arrive field for field.
"""

from __future__ import annotations

import asyncio
import queue
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from edgehub.delivery.endpoint import QueuedMessage
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttProtocol, MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.segment import Codec
from spark_upload.job import run
from spark_upload.receiver import Received, Receiver, ReceiverSettings, dictionary_path
from spark_upload.settings import JobSettings
from tests.spark_upload.messages import assert_bronze_row_carries, expected_edge_message_id, queued_messages

pytestmark = [pytest.mark.spark, pytest.mark.interop, pytest.mark.timeout(180)]


@pytest.mark.parametrize("protocol", [MqttProtocol.V311, MqttProtocol.V5])
async def test_messages_sent_by_the_hubs_mqtt_upstream_reach_bronze_field_for_field(
    spark: SparkSession, tmp_path: Path, protocol: MqttProtocol
) -> None:
    landing = tmp_path / "landing"
    reports: queue.Queue[Received] = queue.Queue()
    sent = []
    publishes = 0
    async with MosquittoPeer(tmp_path) as broker:
        receiver = Receiver(
            ReceiverSettings(broker=f"mqtt://{broker.host}:{broker.port}", landing=str(landing)), on_landed=reports.put
        )
        receiver.start()
        try:
            assert await asyncio.to_thread(receiver.subscribed.wait, 10)
            settings = MqttUpstreamSettings(
                host=broker.host,
                port=broker.port,
                client_id="hub1",
                hub_id="hub1",
                protocol=protocol,
                max_batch_bytes=1024,  # the least: several segments per send (v2 puts 40 in ~1.7 KB)
            )
            async with asyncio.timeout(30), MqttUpstream(settings) as upstream:
                await upstream.wait_connected()
                for first, priority in ((0, 0), (40, 3)):
                    batch = queued_messages(first, 40, priority=priority)
                    result = await upstream.send(batch)
                    assert result.succeeded == tuple(batch)
                    publishes += int(result.details["publishes"])
                    sent.extend(batch)
            landed = [await asyncio.to_thread(reports.get, timeout=10) for _ in range(publishes)]
        finally:
            receiver.stop()
    assert publishes > 2
    assert {(r.outcome, r.acked) for r in landed} == {("written", True)}
    assert {r.topic for r in landed} == {"edgehub/segments/hub1/upstream/p00", "edgehub/segments/hub1/upstream/p03"}

    _job_lands_every_message_in_bronze(spark, landing, tmp_path, sent)


async def test_segments_compressed_with_a_trained_dictionary_reach_bronze_through_the_receiver(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    reports: queue.Queue[Received] = queue.Queue()
    sent = []
    publishes = 0
    async with MosquittoPeer(tmp_path) as broker:
        receiver = Receiver(
            ReceiverSettings(broker=f"mqtt://{broker.host}:{broker.port}", landing=str(landing)), on_landed=reports.put
        )
        receiver.start()
        try:
            assert await asyncio.to_thread(receiver.subscribed.wait, 10)
            settings = MqttUpstreamSettings(
                host=broker.host, port=broker.port, client_id="hub1", hub_id="hub1", compression=Codec.ZSTD
            )
            async with asyncio.timeout(60), MqttUpstream(settings) as upstream:
                await upstream.wait_connected()
                assert upstream.dictionary is not None
                first, extra = 0, 3
                while extra:  # until the dictionary is trained and acknowledged, then a few batches with it
                    batch = queued_messages(first, 40, priority=3)
                    result = await upstream.send(batch)
                    assert result.succeeded == tuple(batch)
                    publishes += int(result.details["publishes"])
                    sent.extend(batch)
                    first += 40
                    extra -= upstream.dictionary.usable is not None
                dict_id = upstream.dictionary.usable.dict_id if upstream.dictionary.usable else 0
            landed = [await asyncio.to_thread(reports.get, timeout=10) for _ in range(publishes + 1)]
        finally:
            receiver.stop()
    assert {(r.outcome, r.acked) for r in landed} == {("written", True)}
    assert (landing / dictionary_path(dict_id)).exists()

    _job_lands_every_message_in_bronze(spark, landing, tmp_path, sent)


def _job_lands_every_message_in_bronze(
    spark: SparkSession, landing: Path, tmp_path: Path, sent: list[QueuedMessage]
) -> None:
    """Run the job over ``landing``: nothing quarantined, and every message sent in bronze field for field."""
    run(
        spark,
        JobSettings(
            landing=str(landing),
            lake=str(tmp_path / "lake"),
            checkpoint=str(tmp_path / "checkpoint"),
            print_metrics=False,
        ),
    )
    assert not (tmp_path / "lake" / "quarantine").exists()
    rows = {r.edge_message_id: r for r in spark.read.parquet(str(tmp_path / "lake" / "bronze")).collect()}
    assert len(rows) == len(sent)
    for qm in sent:
        assert_bronze_row_carries(
            rows[expected_edge_message_id(qm, hub_id="hub1", lane="upstream")], qm, hub_id="hub1", lane="upstream"
        )
