"""The MQTT upstream against a real Mosquitto, through the real link simulator.

Nothing is reported delivered without its PUBACK; a silent or cut link fails the batch and the transport
comes back (calling on_reachable) when the link does; the bytes in flight stay within the window.
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from collections.abc import Sequence

from edgehub.core import FailureKind, Message
from edgehub.core.sas import generate_sas_token
from edgehub.delivery.endpoint import Endpoint, QueuedMessage, ReportsUnreachable
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttProtocol, MqttUpstreamSettings, WireMode
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.mqtt.wire import publish_wire_bytes
from edgehub.upstream.segment import Codec, decode_segment, segment_codec


def _batch(n: int, *, priority: int = 5, body: bytes | None = None, start: int = 0) -> list[QueuedMessage]:
    out = []
    for i in range(start, start + n):
        msg = Message(
            body=body if body is not None else b'{"temp": %d}' % i,
            properties={"kind": "telemetry"},
            system_properties={
                "messageId": f"m-{i}",
                "connectionDeviceId": "dev1",
                "edgeMessageId": f"e-{i}",
            },
        )
        out.append(QueuedMessage(message=msg, offset=i, priority=priority, enqueued_at_s=1.7e9 + i, ttl_s=3600))
    return out


def _settings(link: LinkSim, **kw: object) -> MqttUpstreamSettings:
    base: dict[str, object] = {
        "host": "127.0.0.1",
        "port": link.port,
        "client_id": "hub1",
        "hub_id": "hub1",
        "keepalive_s": 1,
        "ack_timeout_s": 3.0,
        "connect_timeout_s": 2.0,
        "reconnect_min_s": 0.1,
        "reconnect_max_s": 0.5,
    }
    base.update(kw)
    return MqttUpstreamSettings(**base)  # type: ignore[arg-type]


def _ids(msgs: Sequence[QueuedMessage]) -> list[int]:
    return [m.offset for m in msgs]


async def test_mqtt_upstream_is_an_endpoint(link: LinkSim) -> None:
    assert isinstance(MqttUpstream(_settings(link)), Endpoint)


async def test_batch_mode_sends_a_segment_and_reports_success_only_after_the_puback(
    broker: MosquittoPeer, link: LinkSim
) -> None:
    async with (
        asyncio.timeout(20),
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
        MqttUpstream(_settings(link)) as up,
    ):
        await up.wait_connected()
        batch = _batch(20)
        result = await up.send(batch)
        assert _ids(result.succeeded) == _ids(batch)
        assert not result.failed
        await sink.wait_for(1)
        assert sink.messages[0].topic == "edgehub/segments/hub1/upstream/p05"
        records = decode_segment(sink.messages[0].payload)
        assert [r.edge_message_id for r in records] == [f"e-{i}" for i in range(20)]
        assert records[3].body == b'{"temp": 3}'
        wire = publish_wire_bytes(sink.messages[0].topic, len(sink.messages[0].payload))
        assert result.details["wire_bytes"] == str(wire)
        assert up.status().wire_bytes_per_message == wire / 20


async def test_a_batch_above_max_batch_bytes_goes_as_several_segments_in_queue_order(
    broker: MosquittoPeer, link: LinkSim
) -> None:
    async with (
        asyncio.timeout(20),
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
        MqttUpstream(_settings(link, max_batch_bytes=800)) as up,
    ):
        await up.wait_connected()
        batch = _batch(40, body=None)
        batch = [
            QueuedMessage(
                message=Message(body=os.urandom(60), system_properties={"edgeMessageId": f"e-{q.offset}"}),
                offset=q.offset,
                priority=2,
                enqueued_at_s=q.enqueued_at_s,
                ttl_s=60,
            )
            for q in batch
        ]
        result = await up.send(batch)
        assert _ids(result.succeeded) == _ids(batch)
        publishes = int(result.details["publishes"])
        assert publishes > 1
        await sink.wait_for(publishes)
        assert all(len(m.payload) <= 800 for m in sink.messages)
        got = [r.edge_message_id for m in sink.messages for r in decode_segment(m.payload)]
        assert got == [f"e-{i}" for i in range(40)]


async def test_message_mode_publishes_each_message_on_the_telemetry_topic_with_its_property_bag(
    broker: MosquittoPeer, link: LinkSim
) -> None:
    async with (
        asyncio.timeout(20),
        MqttCollector(host=broker.host, port=broker.port, topic="devices/#") as sink,
        MqttUpstream(_settings(link, wire_mode=WireMode.MESSAGE, client_id="edge1")) as up,
    ):
        await up.wait_connected()
        batch = _batch(3)
        result = await up.send(batch)
        assert _ids(result.succeeded) == [0, 1, 2]
        await sink.wait_for(3)
        first = sink.messages[0]
        prefix = "devices/edge1/messages/events/"
        assert first.topic.startswith(prefix)
        bag = dict(urllib.parse.parse_qsl(first.topic.removeprefix(prefix)))
        assert bag == {"kind": "telemetry", "$.mid": "m-0", "$.cdid": "dev1"}
        assert first.payload == b'{"temp": 0}'


async def test_message_mode_on_mqtt5_carries_the_bag_as_user_properties(broker: MosquittoPeer, link: LinkSim) -> None:
    async with (
        asyncio.timeout(20),
        MqttCollector(host=broker.host, port=broker.port, topic="devices/#") as sink,
        MqttUpstream(_settings(link, wire_mode=WireMode.MESSAGE, protocol=MqttProtocol.V5)) as up,
    ):
        await up.wait_connected()
        result = await up.send(_batch(2))
        assert _ids(result.succeeded) == [0, 1]
        await sink.wait_for(2)
        assert sink.messages[1].topic == "devices/hub1/messages/events/"


async def test_send_while_not_connected_fails_the_batch_as_transient(link: LinkSim) -> None:
    up = MqttUpstream(_settings(link))  # never started
    result = await up.send(_batch(2))
    assert not result.succeeded
    assert _ids(result.failed) == [0, 1]
    assert result.failure_kind is FailureKind.TRANSIENT


async def test_silent_link_never_reports_unacked_messages_as_delivered_and_restore_calls_on_reachable(
    link: LinkSim,
) -> None:
    reachable = asyncio.Event()
    calls = 0

    def on_reachable() -> None:
        nonlocal calls
        calls += 1
        reachable.set()

    up = MqttUpstream(_settings(link))
    up.bind(on_reachable)
    async with asyncio.timeout(30), up:
        await reachable.wait()
        assert calls == 1
        reachable.clear()
        link.go_silent()  # no acks, no FIN, no RST
        result = await up.send(_batch(10))
        assert result.details["publishes"] == "1"  # it was published into the dead link, not refused up front
        assert not result.succeeded
        assert _ids(result.failed) == list(range(10))
        assert result.failure_kind in (FailureKind.TIMEOUT, FailureKind.TRANSIENT)
        assert up.status().messages_acked == 0
        link.restore()
        await reachable.wait()
        assert calls >= 2
        again = await up.send(_batch(10))
        assert _ids(again.succeeded) == list(range(10))


async def test_hard_cut_fails_the_batch_and_the_transport_comes_back_after_restore(link: LinkSim) -> None:
    reachable = asyncio.Event()
    up = MqttUpstream(_settings(link, link_rate_bps=8000))
    up.bind(reachable.set)
    async with asyncio.timeout(30), up:
        await reachable.wait()
        reachable.clear()
        link.set_rate(8_000)  # 1 kB/s: the batch is still on the wire when the cut comes
        send = asyncio.create_task(up.send(_batch(5, body=os.urandom(3000))))
        await asyncio.sleep(0)  # let the send start publishing
        link.cut()
        result = await send
        assert not result.succeeded
        assert len(result.failed) == 5
        link.set_rate(None)
        link.restore()
        await reachable.wait()
        assert _ids((await up.send(_batch(3))).succeeded) == [0, 1, 2]


async def test_a_lost_connection_reports_unreachable_and_the_next_connack_reachable(link: LinkSim) -> None:
    reports: list[str] = []
    changed = asyncio.Event()

    def report(what: str) -> None:
        reports.append(what)
        changed.set()

    async def wait_reports(n: int) -> None:
        while len(reports) < n:
            changed.clear()
            await changed.wait()

    up = MqttUpstream(_settings(link))
    assert isinstance(up, ReportsUnreachable)
    up.bind(lambda: report("reachable"))
    up.bind_unreachable(lambda: report("unreachable"))
    async with asyncio.timeout(30), up:
        await wait_reports(1)
        link.cut()
        await wait_reports(2)
        assert not up.connected
        link.restore()
        await wait_reports(3)
        assert up.connected
    assert reports == ["reachable", "unreachable", "reachable"]


async def test_bytes_in_flight_never_exceed_the_window(link: LinkSim) -> None:
    window = 3000
    link.set_rate(64_000)
    up = MqttUpstream(_settings(link, max_inflight_bytes=window, max_batch_bytes=600, ack_timeout_s=20))
    async with asyncio.timeout(40), up:
        await up.wait_connected()
        batch = [
            QueuedMessage(message=Message(body=os.urandom(100)), offset=i, priority=5, enqueued_at_s=1.7e9, ttl_s=60)
            for i in range(120)
        ]
        result = await up.send(batch)
        assert _ids(result.succeeded) == list(range(120))
        status = up.status()
        assert int(result.details["publishes"]) >= 20
        assert status.peak_inflight_bytes <= window
        assert status.peak_inflight_bytes > window // 2  # the window was really used, so the bound was tested
        assert status.inflight_bytes == 0
        assert status.achieved_bps > 0


async def test_status_reports_the_least_round_trip_of_its_publishes(link: LinkSim) -> None:
    link.delay_s = 0.1  # each way: no PUBACK can come back sooner than 0.2 s after its PUBLISH
    up = MqttUpstream(_settings(link))
    async with asyncio.timeout(20), up:
        await up.wait_connected()
        assert up.status().rtt_min_s is None
        assert _ids((await up.send(_batch(3))).succeeded) == [0, 1, 2]
        rtt = up.status().rtt_min_s
        assert rtt is not None
        assert rtt >= 0.2


def test_sas_token_has_the_iot_hub_shape() -> None:
    token = generate_sas_token("myhub.azure-devices.net/devices/d1", "c2VjcmV0", 1_800_000_000)
    assert token.startswith("SharedAccessSignature sr=myhub.azure-devices.net%2Fdevices%2Fd1&sig=")
    assert token.endswith("&se=1800000000")
    assert generate_sas_token("r", "c2VjcmV0", 1) == generate_sas_token("r", "c2VjcmV0", 1)
    assert generate_sas_token("r", "c2VjcmV0", 1) != generate_sas_token("r", "c2VjcmV1", 1)


async def test_max_uplink_bps_caps_the_rate_of_publish_bytes(link: LinkSim) -> None:
    cap_bps = 32_000.0  # 4 kB/s; the link itself is unshaped
    up = MqttUpstream(_settings(link, max_uplink_bps=cap_bps, max_batch_bytes=1000, max_inflight_bytes=8000))
    batch = [
        QueuedMessage(message=Message(body=os.urandom(200)), offset=i, priority=5, enqueued_at_s=1.7e9, ttl_s=60)
        for i in range(60)
    ]
    async with asyncio.timeout(30), up:
        await up.wait_connected()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        result = await up.send(batch)
        elapsed = loop.time() - t0
    wire = int(result.details["wire_bytes"])
    assert len(result.succeeded) == 60
    # The bucket starts full (one segment's worth of burst); everything after it goes at the cap.
    burst = 1500
    assert elapsed >= (wire - burst) * 8 / cap_bps * 0.9


async def test_zstd_batch_mode_publishes_zstd_segments_under_a_zstd_topic_on_mqtt5(
    broker: MosquittoPeer, link: LinkSim
) -> None:
    up = MqttUpstream(_settings(link, compression=Codec.ZSTD, protocol=MqttProtocol.V5))
    async with (
        asyncio.timeout(20),
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
        up,
    ):
        await up.wait_connected()
        result = await up.send(_batch(4, priority=2))
        assert _ids(result.succeeded) == [0, 1, 2, 3]
        await sink.wait_for(1)
    [got] = sink.messages
    assert got.topic == "edgehub/segments/hub1/upstream/p02/zstd"
    assert segment_codec(got.payload) is Codec.ZSTD
    assert [r.edge_message_id for r in decode_segment(got.payload)] == ["e-0", "e-1", "e-2", "e-3"]
