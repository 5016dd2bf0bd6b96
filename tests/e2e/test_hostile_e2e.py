"""``edgehub run`` against a hostile outside, as a process: connections that time out mid-CONNECT give
their memory back (it runs the cycle collector rarely: ``tune_gc``), and a flood of pre-login connections from
one address is capped while a device still logs in and publishes."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.hub_process import identity_add, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(180)]

MANIFEST = {"schemaVersion": "1.1", "routes": {"all": "FROM /messages/* INTO $upstream"}}
# A CONNECT announcing 261,000 bytes (remaining length as a varint), of which 250,000 are sent.
CONNECT_HEAD = b"\x10" + bytes((261_000 & 0x7F | 0x80, (261_000 >> 7) & 0x7F | 0x80, 261_000 >> 14))
CONNECT_PART = CONNECT_HEAD + b"\x00\x04MQTT\x04\x02\x00\x3c" + b"\x00" * 250_000


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


def tls_context(data: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(data / "certs" / "ca.pem"))
    ctx.check_hostname = False
    return ctx


async def partial_connect(port: int, ctx: ssl.SSLContext) -> None:
    """Most of a 261 KB CONNECT over TLS, then nothing until the hub gives up on it."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    except (OSError, ssl.SSLError):
        return  # the hub may close a handshake it had no time for: also a refusal
    try:
        writer.write(CONNECT_PART)
        async with asyncio.timeout(30):
            while await reader.read(65536):
                pass
    except (OSError, ssl.SSLError):
        pass
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (OSError, ssl.SSLError):
            pass


async def test_connections_timed_out_mid_connect_give_their_memory_back(tmp_path: Path) -> None:
    """Before: ~250 MB more per round of 500 such connections, never given back (177 MB -> 1.48 GB). The issue's
    measure: once the attacking connections are gone, RSS is back within 20 MB of where it was before them."""
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(MANIFEST))
    proc, port, _ = await start(
        data,
        manifest,
        "--connect-timeout",
        "2",
        "--max-pending-connections",
        "2000",
        "--max-pending-per-address",
        "2000",
    )
    ctx = tls_context(data)
    # A few connections first, so that what any first connection allocates for good (TLS context caches,
    # the event loop's structures) is in the baseline.
    await asyncio.gather(*(partial_connect(port, ctx) for _ in range(5)))
    before = rss_mb(proc.pid)
    per_round, rounds = 200, 5
    during: list[float] = []
    for _ in range(rounds):
        await asyncio.gather(*(partial_connect(port, ctx) for _ in range(per_round)))
        during.append(rss_mb(proc.pid))
    # The hub collects after connections close (edgehub.runtime.memory: at most every 5 s, checked every second).
    deadline = time.monotonic() + 20
    after = rss_mb(proc.pid)
    while after - before >= 20 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)  # polling a process's RSS: there is no event to wait for
        after = rss_mb(proc.pid)
    await stop(proc)
    rounds_mb = [round(x) for x in during]
    assert after - before < 20, f"RSS before {before:.0f} MB, after each round {rounds_mb}, at the end {after:.0f} MB"


async def test_a_pre_login_flood_from_one_address_is_capped_while_a_device_connects_and_publishes(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(MANIFEST))
    dev_cs = await identity_add(data, "dev1")
    proc, port, _ = await start(data, manifest, "--max-pending-per-address", "32")
    hub = psutil.Process(proc.pid)
    before = hub.num_fds()
    # 300 connections from 127.0.0.2 that never start TLS: each would hold descriptors for 10 s.
    loop = asyncio.get_running_loop()
    flood = []
    for _ in range(300):
        sock = socket.socket()
        sock.bind(("127.0.0.2", 0))
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        flood.append(sock)
    # Those over the cap are closed at accept: their reads end at once.
    closed = 0
    async with asyncio.timeout(20):
        for sock in flood:
            try:
                if await asyncio.wait_for(loop.sock_recv(sock, 1), 0.2) == b"":
                    closed += 1
            except TimeoutError:
                pass  # still held: one of the 32
            except ConnectionError:
                closed += 1
    assert closed >= 300 - 32
    assert hub.num_fds() - before <= 2 * 32 + 8  # two descriptors per held connection, a few of the hub's own
    # A device from another address logs in and publishes meanwhile.
    dev = Paho.make("dev1")
    user = f"{dev_cs.host_name}/dev1/?api-version=2021-04-12"
    assert (
        await dev.connect(
            port, tls_ca=data / "certs" / "ca.pem", user=user, password=dev_cs.sas_token(int(time.time()) + 86_400)
        )
        == 0
    )
    mid = dev.publish("devices/dev1/messages/events/", b"still served")
    async with asyncio.timeout(10):
        assert await dev.publishes.get() == (mid, 0)
    await dev.close()
    for sock in flood:
        sock.close()
    await stop(proc)
