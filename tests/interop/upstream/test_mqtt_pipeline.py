"""The MQTT upstream under the endpoint executor, with a RocksDB store, through the link simulator to Mosquitto:
several batches in flight, a PUBACK per batch as its checkpoint, nothing removed before its ack, and a P0
message behind at most one window of lower-priority bytes."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.core import Message, RouteResult
from edgehub.delivery import EndpointExecutor, ExecutorSettings, PipelinedEndpoint, RetryPolicy
from edgehub.store import QueueId, Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.mqtt.wire import publish_wire_bytes
from edgehub.upstream.segment import decode_segment

pytestmark = pytest.mark.timeout(90)

P5 = QueueId("$upstream", 5)
QUICK = ExecutorSettings(retry_policy=RetryPolicy(minimum_delay_s=0.2, maximum_delay_s=0.5), cleanup_interval_s=3600)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_rocks_store(tmp_path / "db")
    yield s
    await s.close()


def settings(link: LinkSim, **kw: object) -> MqttUpstreamSettings:
    base: dict[str, object] = {
        "host": "127.0.0.1",
        "port": link.port,
        "client_id": "hub1",
        "hub_id": "hub1",
        "keepalive_s": 1,
        "ack_timeout_s": 2.0,
        "connect_timeout_s": 2.0,
        "reconnect_min_s": 0.1,
        "reconnect_max_s": 0.5,
    }
    base.update(kw)
    return MqttUpstreamSettings(**base)  # type: ignore[arg-type]


async def enqueue(store: Store, ex: EndpointExecutor, bodies: list[bytes], priority: int) -> None:
    for body in bodies:
        await store.enqueue(Message(body=body), [RouteResult("$upstream", priority, None)])
    ex.notify()


def records(sink: MqttCollector) -> list[tuple[int, bytes]]:
    return [(r.priority, r.body) for m in sink.messages for r in decode_segment(m.payload)]


async def test_the_mqtt_upstream_is_pipelined(broker: MosquittoPeer, link: LinkSim) -> None:
    assert isinstance(MqttUpstream(settings(link)), PipelinedEndpoint)


async def test_a_silent_link_removes_nothing_from_the_store_before_its_puback(
    store: Store, broker: MosquittoPeer, link: LinkSim
) -> None:
    up = MqttUpstream(settings(link, max_batch_bytes=600))
    await up.start()
    bodies = [b'{"n": %d, "pad": "%s"}' % (i, os.urandom(40).hex().encode()) for i in range(30)]
    async with (
        asyncio.timeout(60),
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
        EndpointExecutor(store, up, settings=QUICK) as ex,
    ):
        await up.wait_connected()
        link.go_silent()  # no acks, no FIN, no RST from here on
        await enqueue(store, ex, bodies, 5)
        await ex.wait_for(lambda: up.status().peak_inflight_bytes > 0)  # published into the dead link
        await ex.wait_for(lambda: not ex.reachable)  # the ack timeout gave the connection up
        await ex.cleanup()
        assert store.checkpoint(P5).committed == -1
        assert len(store.references(P5, 0, 100)) == 30
        assert up.status().messages_acked == 0
        assert sink.messages == []
        link.restore()
        await ex.wait_for(lambda: store.checkpoint(P5).committed == 29)
        await ex.cleanup()
        assert store.references(P5, 0, 100) == []
        assert sorted({body for _, body in records(sink)}) == sorted(bodies)  # at least once, every one


async def test_a_p0_message_waits_behind_at_most_one_window_of_backlog_bytes(
    store: Store, broker: MosquittoPeer, link: LinkSim
) -> None:
    link.set_rate(32_000)  # 4 kB/s: the backlog below takes about 20 s
    window, batch = 3000, 1000
    up = MqttUpstream(settings(link, max_inflight_bytes=window, max_batch_bytes=batch, ack_timeout_s=20))
    await up.start()
    backlog = [os.urandom(100) for _ in range(400)]  # incompressible: about 4 records a segment
    async with (
        asyncio.timeout(80),
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
        EndpointExecutor(store, up, settings=QUICK) as ex,
    ):
        await up.wait_connected()
        await enqueue(store, ex, backlog, 5)
        await sink.wait_for(5)  # the backlog flows and the window is full
        seen = len(sink.messages)
        await enqueue(store, ex, [b"alert"], 0)
        while not any(r.priority == 0 for m in sink.messages[seen:] for r in decode_segment(m.payload)):
            await sink.wait_for(len(sink.messages) + 1)
        ahead = 0
        for m in sink.messages[seen:]:
            if any(r.priority == 0 for r in decode_segment(m.payload)):
                break
            ahead += publish_wire_bytes(m.topic, len(m.payload))
        # What was in flight when the alert came, plus the batch the executor had already chosen.
        assert ahead <= window + batch
        assert len(records(sink)) < len(backlog)  # the alert did not wait for the backlog
