"""The peer fixture starts a real Mosquitto that answers MQTT, by the container when an engine answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edgehub.testing.peers import MosquittoPeer, PeerWay, docker_engine_answers


def _one_from(port: int, *options: str) -> list[str]:
    """mosquitto_sub's arguments for one message on ``t/1`` from the broker on ``port``."""
    return ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", "t/1", "-C", "1", *options]


async def _round_trip(port: int) -> bytes:
    sub = await asyncio.create_subprocess_exec(*_one_from(port, "-q", "1"), stdout=asyncio.subprocess.PIPE)
    try:
        # mosquitto_sub offers no readiness signal; a retained message reaches it whenever it subscribes
        pub = await asyncio.create_subprocess_exec(
            "mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", "t/1", "-m", "hi", "-q", "1", "-r"
        )
        assert await pub.wait() == 0
        assert sub.stdout is not None
        return (await sub.stdout.readline()).strip()
    finally:
        if sub.returncode is None:
            sub.kill()
        await sub.wait()


async def test_binary_peer_is_a_working_mqtt_broker_on_loopback(tmp_path: Path) -> None:
    async with asyncio.timeout(30), MosquittoPeer(tmp_path, way=PeerWay.BINARY) as broker:
        assert broker.how is PeerWay.BINARY
        assert broker.host == "127.0.0.1"
        assert await _round_trip(broker.port) == b"hi"


async def _retained(port: int) -> bytes:
    sub = await asyncio.create_subprocess_exec(*_one_from(port, "-W", "10"), stdout=asyncio.subprocess.PIPE)
    out, _ = await sub.communicate()
    return out.strip()


async def test_binary_peer_with_persistence_keeps_retained_messages_across_restart(tmp_path: Path) -> None:
    async with asyncio.timeout(40):
        async with MosquittoPeer(tmp_path, way=PeerWay.BINARY, persistence=True) as first:
            await _round_trip(first.port)
        async with MosquittoPeer(tmp_path, way=PeerWay.BINARY, persistence=True) as second:
            assert await _retained(second.port) == b"hi"


async def test_binary_peer_without_persistence_forgets_on_restart(tmp_path: Path) -> None:
    async with asyncio.timeout(40):
        async with MosquittoPeer(tmp_path, way=PeerWay.BINARY) as first:
            await _round_trip(first.port)
        async with MosquittoPeer(tmp_path, way=PeerWay.BINARY) as second:
            sub = await asyncio.create_subprocess_exec(
                "mosquitto_sub",
                "-h",
                "127.0.0.1",
                "-p",
                str(second.port),
                "-t",
                "t/1",
                "-C",
                "1",
                "-W",
                "1",
                stdout=asyncio.subprocess.PIPE,
            )
            out, _ = await sub.communicate()
            assert out == b""


async def test_default_peer_picks_the_way_the_machine_offers(tmp_path: Path) -> None:
    engine = await asyncio.to_thread(docker_engine_answers)
    async with asyncio.timeout(120), MosquittoPeer(tmp_path) as broker:
        assert broker.how is (PeerWay.CONTAINER if engine else PeerWay.BINARY)
        assert await _round_trip(broker.port) == b"hi"


@pytest.mark.skipif(not docker_engine_answers(), reason="no Docker engine answers on this machine")
async def test_container_peer_is_a_working_mqtt_broker_on_loopback(tmp_path: Path) -> None:
    async with asyncio.timeout(120), MosquittoPeer(tmp_path, way=PeerWay.CONTAINER) as broker:
        assert broker.how is PeerWay.CONTAINER
        assert await _round_trip(broker.port) == b"hi"
