"""``edgehub run`` stopping as systemd stops it: SIGTERM in the middle of a stream of QoS 1 publishes stops the
hub with exit status 0 and every message it acknowledged is in the store; under ``Type=notify`` it says READY=1
once it listens, pings WATCHDOG=1, and says STOPPING=1 on SIGTERM (a real unix datagram socket stands in for
systemd's)."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

import pytest

from edgehub.runtime.cli.app import DEFAULT_MANIFEST
from edgehub.runtime.compose.store import open_store
from tests.e2e.hub_process import identity_add, start
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

SENT = 20_000


async def stored_bodies(data: Path) -> list[bytes]:
    store = open_store(data)
    try:
        return [item.message.body for q in store.queues("$upstream") for item in store.read(q, 0, SENT * 2)]
    finally:
        await store.close()


async def test_sigterm_mid_stream_exits_0_with_every_acknowledged_message_stored(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cs = await identity_add(data, "dev1")
    proc, port, _ = await start(data, DEFAULT_MANIFEST, "--no-upstream")
    dev = Paho.make("dev1")
    dev.client.max_inflight_messages_set(100)
    user = f"{cs.host_name}/dev1/?api-version=2021-04-12"
    assert (
        await dev.connect(
            port, tls_ca=data / "certs" / "ca.pem", user=user, password=cs.sas_token(int(time.time()) + 86_400)
        )
        == 0
    )
    body_of = {dev.publish("devices/dev1/messages/events/", f"m{n}".encode()): f"m{n}".encode() for n in range(SENT)}
    acked: set[bytes] = set()
    async with asyncio.timeout(60):
        while len(acked) < 500:
            mid, rc = await dev.publishes.get()
            assert rc == 0
            acked.add(body_of[mid])
        proc.send_signal(signal.SIGTERM)  # mid-stream: about 100 publishes are in flight
        out, _ = await proc.communicate()
        while not dev.gone or not dev.publishes.empty():
            mid, rc = await dev.publishes.get()
            acked.add(body_of[mid])
    dev.client.loop_stop()
    assert proc.returncode == 0
    assert out.decode().rstrip().endswith("stopped")
    assert len(acked) < SENT  # the stop came while the device was still sending
    stored = await stored_bodies(data)
    assert len(stored) == len(set(stored))
    # Every PUBACK was a promise kept, and every message stored got its PUBACK: the writes in flight at the stop
    # were finished and acknowledged before the connection closed.
    assert set(stored) == acked


async def test_under_systemd_it_notifies_ready_pings_the_watchdog_and_says_stopping(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()

        async def receive() -> str:
            return (await loop.sock_recv(sock, 4096)).decode()

        env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "300000"}  # WatchdogSec=0.3: a ping every 0.15 s
        started = time.monotonic()
        proc, port, _ = await start(tmp_path / "data", DEFAULT_MANIFEST, "--no-upstream", env=env)
        states: list[str] = []
        async with asyncio.timeout(30):
            while not any(s.startswith("READY=1") for s in states) or states.count("WATCHDOG=1") < 3:
                states.append(await receive())
            ready = next(s for s in states if s.startswith("READY=1"))
            # MQTT's listener first, then AMQP's (the line scripts read): "listening: tls H:P, amqps H:P"
            assert ready.startswith(f"READY=1\nSTATUS=listening: tls 127.0.0.1:{port}")
            proc.send_signal(signal.SIGTERM)
            while (state := await receive()) != "STOPPING=1":
                assert state == "WATCHDOG=1"
            await proc.communicate()
        assert proc.returncode == 0
        assert time.monotonic() - started < 30
