"""Reconnecting after a hard cut: a steady short interval while attempts are refused at once, a hard backoff only
when the far side answers and refuses, none after an attempt that hung."""

from __future__ import annotations

import asyncio
import random
import subprocess
from pathlib import Path

from edgehub.core import FailureKind
from edgehub.testing.linksim import LinkSim
from edgehub.testing.peers import MosquittoPeer, PeerWay
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.reconnect import ConnectFailure, ReconnectSchedule, connect_failure_of


def test_refused_attempts_keep_a_steady_jittered_interval_however_many_came_before() -> None:
    schedule = ReconnectSchedule(interval_s=0.5, jitter=0.5)
    rng = random.Random(7)
    waits = [schedule.delay_s(ConnectFailure.AT_ONCE, rng=rng) for _ in range(500)]
    assert all(0.5 <= w <= 0.75 for w in waits)
    assert len({round(w, 3) for w in waits}) > 10  # jittered, not in lockstep


def test_a_hung_attempt_is_followed_at_once_and_a_refusal_backs_off_hard_up_to_its_cap() -> None:
    schedule = ReconnectSchedule(interval_s=0.5, jitter=0.0, refused_min_s=5.0, refused_max_s=60.0)
    assert schedule.delay_s(ConnectFailure.HUNG) == 0.0
    waits = [schedule.delay_s(ConnectFailure.REFUSED, n) for n in range(1, 8)]
    assert waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]


def test_failure_kinds_map_to_connect_failures() -> None:
    assert connect_failure_of(FailureKind.TIMEOUT) is ConnectFailure.HUNG
    assert connect_failure_of(FailureKind.PERMANENT) is ConnectFailure.REFUSED
    assert connect_failure_of(FailureKind.TRANSIENT) is ConnectFailure.AT_ONCE


async def test_a_long_hard_cut_is_tried_at_a_steady_interval_and_the_link_is_used_again_when_it_returns(
    broker: MosquittoPeer, link: LinkSim
) -> None:
    # The default schedule (0.5 s + jitter): before, each refused attempt doubled the wait up to 30 s, so ten
    # attempts into a cut took over a minute.
    settings = MqttUpstreamSettings(host="127.0.0.1", port=link.port, client_id="hub1", hub_id="hub1")
    async with asyncio.timeout(30), MqttUpstream(settings) as up:
        await up.wait_connected()
        link.cut()
        await up.wait_for(lambda: not up.connected)
        async with asyncio.timeout(15):
            await link.wait_accepted(link.accepted + 10)
        link.restore()
        await up.wait_connected()
        assert up.status().connects == 2


async def test_a_refused_connack_backs_off_hard_and_sends_do_not_cut_that_short(tmp_path: Path) -> None:
    pw = tmp_path / "passwd"
    cmd = ["mosquitto_passwd", "-b", "-c", str(pw), "edge", "s3cret"]
    await asyncio.to_thread(subprocess.run, cmd, check=True, capture_output=True)
    pw.chmod(0o600)
    async with (
        asyncio.timeout(30),
        MosquittoPeer(
            tmp_path, way=PeerWay.BINARY, allow_anonymous=False, extra_config=[f"password_file {pw}"]
        ) as broker,
    ):
        settings = MqttUpstreamSettings(
            host="127.0.0.1", port=broker.port, client_id="hub1", hub_id="hub1", username="edge", password="no"
        )
        async with MqttUpstream(settings) as up:
            await up.wait_for(lambda: up.connect_attempts >= 1)
            retried = asyncio.create_task(up.wait_for(lambda: up.connect_attempts >= 2))
            for _ in range(20):  # the executor's probes, each asking for a reconnect now
                up.reconnect_now()
                done, _ = await asyncio.wait({retried}, timeout=0.05)
                assert not done  # still waiting out the refusal's backoff (5 s at least)
            retried.cancel()
            assert not up.connected
