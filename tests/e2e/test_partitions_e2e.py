"""Partitions and duplicates through the real hub: paho devices over real sockets, the MQTT head, the RocksDB store
in tmp_path, the executors; the upstream lanes are steerable test endpoints (``edgehub.testing.TestEndpoint``),
so a test can take one down and see where messages go."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from paho.mqtt.enums import MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.reasoncodes import ReasonCode

from edgehub.core.endpoints import upstream_lane_id
from edgehub.delivery import Endpoint
from edgehub.hub.lanes import UpstreamOptions, stable_partition
from edgehub.runtime.compose.upstream import lane_settings
from edgehub.testing import ManualClock, TestEndpoint
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.segment import decode_segment
from tests.e2e.conftest import DEV, SENSOR, Rig, running_hub, sas, username
from tests.protocol_heads.mqtt.conftest import Paho
from tests.store.fulldisk import fill, small_disk

__all__ = ["small_disk"]  # the fixture, imported for use here

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

UP = {"up": "FROM /messages/* INTO $upstream"}
EVENTS = "devices/dev1/messages/events/"
V5 = MQTTProtocolVersion.MQTTv5
PAYLOAD_REFUSED = 0x83  # REJECT_REASONS["partition_key_mismatch"]


def lanes(n: int) -> list[TestEndpoint]:
    return [TestEndpoint(upstream_lane_id(i, n), max_batch_messages=100) for i in range(n)]


def bodies(lane: TestEndpoint) -> list[bytes]:
    return [qm.message.body for qm in lane.delivered]


async def checkpointed(rig: Rig, eps: Sequence[Endpoint]) -> None:
    """Wait until each of these lanes has checkpointed everything queued on it (delivery comes first)."""

    def settled(lane_id: str) -> bool:
        return all(
            lane.undelivered_messages == 0 for lane in rig.hub.upstream_status().lanes if lane.endpoint_id == lane_id
        )

    async with asyncio.timeout(10):
        for ep in eps:
            await rig.hub.executors[ep.endpoint_id].wait_for(functools.partial(settled, ep.endpoint_id))


async def device(rig: Rig, protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv311) -> Paho:
    dev = Paho.make(DEV.id, protocol=protocol)
    assert await dev.connect(rig.tcp, user=username(DEV), password=sas(DEV, clock=rig.hub.clock)) == 0
    return dev


async def send(dev: Paho, bag: str, body: bytes, properties: PahoProperties | None = None) -> int:
    """Publish one message (QoS 1) and return its PUBACK reason code."""
    mid = dev.publish(EVENTS + bag, body, properties=properties)
    async with asyncio.timeout(10):
        got_mid, rc = await dev.publishes.get()
    assert got_mid == mid
    return rc


def user_properties(*pairs: tuple[str, str]) -> PahoProperties:
    props = PahoProperties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = list(pairs)
    return props


async def test_messages_with_a_session_id_stay_on_their_lane_in_order(tmp_path: Path) -> None:
    eps = lanes(3)
    async with running_hub(tmp_path, routes=UP, endpoints=eps, upstream=UpstreamOptions(partitions=3)) as rig:
        dev = await device(rig)
        keys = ["ship-1", "ship-2", "ship-3", "ship-4"]
        lane_of = {k: stable_partition(k, 3) for k in keys}
        assert len(set(lane_of.values())) >= 2  # the keys spread: pinning is visible
        mids = [dev.publish(f"{EVENTS}$.sid={k}&$.mid={k}-{i}", f"{k}:{i}".encode()) for i in range(10) for k in keys]
        async with asyncio.timeout(20):
            acks = [await dev.publishes.get() for _ in mids]
            for i, ep in enumerate(eps):
                await ep.wait_delivered(10 * sum(1 for k in keys if lane_of[k] == i))
        assert sorted(acks) == sorted((m, 0) for m in mids)
        for k in keys:
            for i, ep in enumerate(eps):
                mine = [b for b in bodies(ep) if b.startswith(f"{k}:".encode())]
                assert mine == ([f"{k}:{n}".encode() for n in range(10)] if i == lane_of[k] else [])
        await checkpointed(rig, eps)
        status = rig.hub.upstream_status()
        assert status.partitions == 3
        assert status.lanes_up == 3
        assert status.batches_sent == sum(ep.sends for ep in eps)
        assert status.held_messages == 0  # delivered: removed with the checkpoints that delivered them
        assert status.undelivered_messages == 0
        assert status.transport is None  # test endpoints report no transport status
        await dev.close()


async def test_a_partition_key_in_mqtt5_user_properties_pins_the_lane(tmp_path: Path) -> None:
    eps = lanes(4)
    async with running_hub(tmp_path, routes=UP, endpoints=eps, upstream=UpstreamOptions(partitions=4)) as rig:
        dev = await device(rig, V5)
        for n in range(5):
            assert await send(dev, "", f"pk:{n}".encode(), user_properties(("$.pk", "tank-9"))) == 0
        lane = eps[stable_partition("tank-9", 4)]
        async with asyncio.timeout(10):
            await lane.wait_delivered(5)
        assert bodies(lane) == [f"pk:{n}".encode() for n in range(5)]
        assert lane.delivered[0].message.system_properties["partitionKey"] == "tank-9"
        assert sum(len(ep.delivered) for ep in eps) == 5
        await dev.close()


async def test_keyless_messages_go_round_robin_over_the_lanes(tmp_path: Path) -> None:
    eps = lanes(3)
    async with running_hub(tmp_path, routes=UP, endpoints=eps, upstream=UpstreamOptions(partitions=3)) as rig:
        dev = await device(rig)
        for n in range(9):
            assert await send(dev, "", f"k{n}".encode()) == 0
        async with asyncio.timeout(10):
            for ep in eps:
                await ep.wait_delivered(3)
        assert [bodies(ep) for ep in eps] == [[f"k{n}".encode() for n in range(i, 9, 3)] for i in range(3)]
        await dev.close()


async def test_a_keyless_message_whose_lane_is_down_moves_to_a_lane_that_is_up(tmp_path: Path) -> None:
    eps = lanes(3)
    async with running_hub(tmp_path, routes=UP, endpoints=eps, upstream=UpstreamOptions(partitions=3)) as rig:
        dev = await device(rig)
        eps[1].go_down()
        assert await send(dev, "", b"k0") == 0  # lane 0
        assert await send(dev, "", b"k1") == 0  # lane 1: not known to be down until its send fails
        lane1 = rig.hub.executors[upstream_lane_id(1, 3)]
        async with asyncio.timeout(10):
            await lane1.wait_for(lambda: not rig.hub.lanes.is_up(1))
        assert rig.hub.upstream_status().lanes_up == 2
        for n in range(2, 6):  # round-robin would give lanes 2, 0, 1, 2: lane 1's turn moves to lane 2
            assert await send(dev, "", f"k{n}".encode()) == 0
        async with asyncio.timeout(10):
            await eps[0].wait_delivered(3)
            await eps[2].wait_delivered(2)
        assert bodies(eps[0]) == [b"k0", b"k3", b"k5"]
        assert bodies(eps[2]) == [b"k2", b"k4"]
        assert bodies(eps[1]) == []
        await checkpointed(rig, [eps[0], eps[2]])
        status = rig.hub.upstream_status()
        assert [lane.undelivered_messages for lane in status.lanes] == [0, 1, 0]
        assert status.undelivered_messages == 1
        eps[1].revive()  # the retry wait is 600 s: the lane's reachable report cuts it short
        async with asyncio.timeout(10):
            await eps[1].wait_delivered(1)
            await lane1.wait_for(lambda: rig.hub.lanes.is_up(1))
        assert bodies(eps[1]) == [b"k1"]
        assert rig.hub.upstream_status().lanes_up == 3
        await dev.close()


async def test_a_keyed_message_waits_for_its_lane_even_when_it_is_down(tmp_path: Path) -> None:
    eps = lanes(2)
    key = "ship-1"
    pinned = stable_partition(key, 2)
    async with running_hub(tmp_path, routes=UP, endpoints=eps, upstream=UpstreamOptions(partitions=2)) as rig:
        dev = await device(rig)
        eps[pinned].go_down()
        assert await send(dev, f"$.sid={key}", b"s0") == 0
        lane = rig.hub.executors[upstream_lane_id(pinned, 2)]
        async with asyncio.timeout(10):
            await lane.wait_for(lambda: not rig.hub.lanes.is_up(pinned))
        assert await send(dev, f"$.sid={key}", b"s1") == 0
        assert rig.hub.upstream_status().lanes[pinned].undelivered_messages == 2
        eps[pinned].revive()
        async with asyncio.timeout(10):
            await eps[pinned].wait_delivered(2)
        assert bodies(eps[pinned]) == [b"s0", b"s1"]
        assert bodies(eps[1 - pinned]) == []
        await dev.close()


async def test_a_session_id_with_a_different_partition_key_is_refused_with_0x83_and_nothing_is_stored(
    tmp_path: Path,
) -> None:
    eps = lanes(2)
    async with running_hub(tmp_path, routes=UP, endpoints=eps, upstream=UpstreamOptions(partitions=2)) as rig:
        dev = await device(rig, V5)
        acks: asyncio.Queue[tuple[int, str | None]] = asyncio.Queue()

        def on_publish(c: object, u: object, mid: int, rc: ReasonCode, props: PahoProperties) -> None:
            dev.loop.call_soon_threadsafe(acks.put_nowait, (rc.value, getattr(props, "ReasonString", None)))

        dev.client.on_publish = on_publish
        dev.publish(f"{EVENTS}$.sid=s1&$.pk=p1", b"conflict")
        dev.publish(EVENTS, b"conflict too", properties=user_properties(("$.sid", "s1"), ("$.pk", "p1")))
        dev.publish(f"{EVENTS}$.sid=s1&$.pk=s1", b"agreeing")
        async with asyncio.timeout(10):
            got = [await acks.get() for _ in range(3)]
        why = "sessionId 's1' and partitionKey 'p1' differ"
        assert [(rc, (text or "")[: len(why)]) for rc, text in got] == [
            (PAYLOAD_REFUSED, why),
            (PAYLOAD_REFUSED, why),
            (0, ""),
        ]
        async with asyncio.timeout(10):
            await eps[stable_partition("s1", 2)].wait_delivered(1)
        assert [b for ep in eps for b in bodies(ep)] == [b"agreeing"]
        assert rig.hub.upstream_status().held_messages <= 1
        await dev.close()


async def test_a_mqtt311_client_sending_a_conflicting_partition_key_is_disconnected_without_an_ack(
    tmp_path: Path,
) -> None:
    eps = lanes(2)
    async with running_hub(tmp_path, routes=UP, endpoints=eps, upstream=UpstreamOptions(partitions=2)) as rig:
        dev = await device(rig)
        dev.publish(f"{EVENTS}$.sid=s1&$.pk=p1", b"conflict")
        async with asyncio.timeout(10):
            await dev.disconnects.get()
        assert dev.publishes.empty()
        assert rig.hub.upstream_status().held_messages == 0
        await dev.close()


async def test_a_duplicate_is_acked_and_dropped_across_a_restart_until_its_window_has_passed(tmp_path: Path) -> None:
    clock = ManualClock()
    options = UpstreamOptions(duplicate_detection=True, duplicate_window_s=600)
    first = TestEndpoint("$upstream")
    async with running_hub(tmp_path, routes=UP, endpoints=[first], upstream=options, clock=clock) as rig:
        dev = await device(rig)
        assert await send(dev, "$.mid=m-1", b"first") == 0
        assert await send(dev, "$.mid=m-1", b"second copy") == 0  # acknowledged ...
        assert await send(dev, "$.mid=m-2", b"next") == 0
        async with asyncio.timeout(10):
            await first.wait_delivered(2)
        assert bodies(first) == [b"first", b"next"]  # ... and dropped
        assert rig.hub.duplicates_dropped == 1
        assert rig.hub.upstream_status().duplicates_dropped == 1
        await dev.close()

    clock = ManualClock(clock.time() + 300)  # the hub comes back 300 s later: still inside m-1's window
    again = TestEndpoint("$upstream")
    async with running_hub(tmp_path, routes=UP, endpoints=[again], upstream=options, clock=clock) as rig:
        dev = await device(rig)
        assert await send(dev, "$.mid=m-1", b"after restart") == 0
        assert await send(dev, "$.mid=m-3", b"sentinel") == 0
        async with asyncio.timeout(10):
            await again.wait_delivered(1)
        assert bodies(again) == [b"sentinel"]
        assert rig.hub.duplicates_dropped == 1
        clock.advance(300)  # 600 s after m-1 was accepted: its window has passed
        assert await send(dev, "$.mid=m-1", b"a new m-1") == 0
        async with asyncio.timeout(10):
            await again.wait_delivered(2)
        assert bodies(again) == [b"sentinel", b"a new m-1"]
        assert rig.hub.duplicates_dropped == 1
        await dev.close()


async def test_another_identity_may_use_the_same_message_id(tmp_path: Path) -> None:
    ep = TestEndpoint("$upstream")
    options = UpstreamOptions(duplicate_detection=True)
    async with running_hub(tmp_path, routes=UP, endpoints=[ep], upstream=options) as rig:
        dev = await device(rig)
        assert await send(dev, "$.mid=m-1", b"from dev1") == 0
        sensor = Paho.make(SENSOR.id)
        assert await sensor.connect(rig.tcp, user=username(SENSOR), password=sas(SENSOR, clock=rig.hub.clock)) == 0
        sensor.publish("devices/edge/modules/sensor/messages/events/$.mid=m-1", b"from edge/sensor")
        async with asyncio.timeout(10):
            assert (await sensor.publishes.get())[1] == 0
            await ep.wait_delivered(2)
        assert sorted(bodies(ep)) == [b"from dev1", b"from edge/sensor"]
        assert rig.hub.duplicates_dropped == 0
        await sensor.close()
        await dev.close()


async def test_with_duplicate_detection_the_message_id_pins_a_keyless_message(tmp_path: Path) -> None:
    eps = lanes(4)
    options = UpstreamOptions(partitions=4, duplicate_detection=True)
    async with running_hub(tmp_path, routes=UP, endpoints=eps, upstream=options) as rig:
        dev = await device(rig)
        for n in range(4):
            assert await send(dev, f"$.mid=order-{n}", f"o{n}".encode()) == 0
        async with asyncio.timeout(10):
            for n in range(4):
                lane = eps[stable_partition(f"order-{n}", 4)]
                await lane.wait_delivered(1)
        for n in range(4):
            assert f"o{n}".encode() in bodies(eps[stable_partition(f"order-{n}", 4)])
        await dev.close()


async def test_a_message_whose_store_write_failed_is_not_taken_for_a_duplicate_when_the_device_retries(
    small_disk: Path,
) -> None:
    ep = TestEndpoint("$upstream")
    options = UpstreamOptions(duplicate_detection=True)
    async with running_hub(small_disk, routes=UP, endpoints=[ep], upstream=options) as rig:
        dev = await device(rig, V5)
        assert await send(dev, "$.mid=m-0", b"before") == 0  # the queue exists: the write itself will fail
        fill(small_disk / "filler")
        # A failed write is a refusal of that message (MQTT 5: 0x97, the device keeps it and retries later),
        # not of the connection.
        assert await send(dev, "$.mid=m-1", b"x" * 100_000) == 0x97
        (small_disk / "filler").unlink()
        assert await send(dev, "$.mid=m-1", b"x" * 100_000) == 0
        async with asyncio.timeout(10):
            await ep.wait_delivered(2)
        assert rig.hub.duplicates_dropped == 0
        assert [qm.message.message_id for qm in ep.delivered] == ["m-0", "m-1"]
        await dev.close()


async def lanes_of_records(sink: MqttCollector, count: int) -> list[tuple[str, bytes]]:
    """Wait until the segments collected hold ``count`` records; (lane, body) of each, in arrival order."""
    while True:
        out = [(m.topic.split("/")[3], r.body) for m in sink.messages for r in decode_segment(m.payload)]
        if len(out) >= count:
            return out
        await sink.wait_for(len(sink.messages) + 1)


async def test_keyless_messages_avoid_a_lane_whose_mqtt_connection_is_down_until_it_connects(tmp_path: Path) -> None:
    async with (
        MosquittoPeer(tmp_path) as broker,
        LinkSim(target_host=broker.host, target_port=broker.port) as link,
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
    ):
        link.cut()  # lane 1 reaches the broker through this link only
        base = MqttUpstreamSettings(
            host="127.0.0.1",
            port=broker.port,
            client_id="gw",
            hub_id="gw",
            linger_s=0.0,
            connect_timeout_s=2.0,
            reconnect_min_s=0.1,
            reconnect_max_s=0.3,
        )
        lane0 = MqttUpstream(lane_settings(base, "$upstream/0"))
        lane1 = MqttUpstream(replace(lane_settings(base, "$upstream/1"), port=link.port))
        await lane0.start()  # the executors close them when the hub stops
        await lane1.start()
        options = UpstreamOptions(partitions=2)
        async with running_hub(tmp_path / "hub", routes=UP, endpoints=[lane0, lane1], upstream=options) as rig:
            async with asyncio.timeout(10):
                await lane0.wait_connected()
            assert [rig.hub.lanes.is_up(i) for i in (0, 1)] == [True, False]
            dev = await device(rig)
            for n in range(4):
                assert await send(dev, "", f"k{n}".encode()) == 0
            async with asyncio.timeout(20):
                assert await lanes_of_records(sink, 4) == [("upstream-p0", f"k{n}".encode()) for n in range(4)]
            link.restore()
            async with asyncio.timeout(20):
                await lane1.wait_connected()
            for n in range(4, 8):
                assert await send(dev, "", f"k{n}".encode()) == 0
            async with asyncio.timeout(20):
                got = await lanes_of_records(sink, 8)
            assert sorted(got[4:], key=lambda r: r[1]) == [
                ("upstream-p1", b"k4"),
                ("upstream-p0", b"k5"),
                ("upstream-p1", b"k6"),
                ("upstream-p0", b"k7"),
            ]
            await checkpointed(rig, [lane0, lane1])
            status = rig.hub.upstream_status()
            assert status.lanes_up == 2
            assert status.transport is not None
            assert status.transport.messages_acked == 8  # summed over the lanes' connections
            assert status.transport.connects == 2
            assert [lane.transport.messages_acked for lane in status.lanes if lane.transport] == [6, 2]
            await dev.close()
