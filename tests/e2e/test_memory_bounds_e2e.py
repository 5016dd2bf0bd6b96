"""Memory bounds of ``edgehub run``, measured as the process's RSS (psutil), each bound stated: 1,000
idle connected devices, 10,000 connections over time (connect, publish, disconnect), and a module that never
reads what is delivered to it."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
import time
from pathlib import Path

import psutil
import pytest

from edgehub.core import Identity
from edgehub.core.sas import generate_sas_token, resource_uri
from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import MQTT_311, ConnAck, Connect, Disconnect, PubAck, Publish
from edgehub.runtime.compose.config import DEFAULT_HOST_NAME
from edgehub.runtime.compose.store import open_identities, open_store
from tests.e2e import hub_process

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(240)]

EXPIRY = int(time.time()) + 86_400  # within the hub's maximum token lifetime (a year)


async def add_identities(data: Path, identities: list[Identity]) -> dict[str, str]:
    """Symmetric keys for ``identities``, written to the hub's store before it starts (``identity add`` is a
    process each: too slow for a thousand)."""
    store = open_store(data)
    try:
        registry = open_identities(store, DEFAULT_HOST_NAME, data_dir=data)
        return {i.id: await registry.add_symmetric_key(i) for i in identities}
    finally:
        await store.close()


async def start(data: Path, manifest: Path, *extra: str) -> tuple[asyncio.subprocess.Process, dict[str, int]]:
    """``edgehub run`` with plain MQTT and TLS on free ports; the process and its ports."""
    proc = await asyncio.create_subprocess_exec(
        hub_process.EDGEHUB,
        "run",
        "--manifest",
        str(manifest),
        "--data-dir",
        str(data),
        "--mqtt-port",
        "0",
        "--mqtts-port",
        "0",
        "--no-upstream",  # what reaches $upstream stays in the store: no upload's work in the figures
        "--amqps-port",
        "0",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,  # INFO lines per connection: nobody reads them here
    )
    hub_process._started.append(proc.pid)
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        while True:
            line = (await proc.stdout.readline()).decode()
            assert line, "edgehub run ended early"
            m = re.search(r"listening: tcp 127\.0\.0\.1:(\d+), tls 127\.0\.0\.1:(\d+)", line)
            if m:
                return proc, {"tcp": int(m.group(1)), "tls": int(m.group(2))}


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


class Device:
    """One identity's raw MQTT 3.1.1 connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = Decoder(protocol_level=MQTT_311)
        self.packets: list[object] = []

    @classmethod
    async def login(
        cls, port: int, identity: Identity, key: str, *, tls: ssl.SSLContext | None = None, keepalive_s: int = 0
    ) -> Device:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=tls, server_hostname="localhost" if tls else None
        )
        d = cls(reader, writer)
        token = generate_sas_token(resource_uri(DEFAULT_HOST_NAME, identity), key, EXPIRY)
        user = f"{DEFAULT_HOST_NAME}/{identity.id}/?api-version=2021-04-12"
        d.send(Connect(identity.id, keepalive_s=keepalive_s, username=user, password=token.encode()))
        assert await d.next() == ConnAck(0, False)
        return d

    def send(self, packet: Connect | Publish | Disconnect) -> None:
        self.writer.write(encode(packet, MQTT_311))

    async def next(self) -> object:
        async with asyncio.timeout(20):
            while not self.packets:
                data = await self.reader.read(65536)
                assert data, "closed by the hub"
                self.packets.extend(self.decoder.receive_data(data))
        return self.packets.pop(0)

    async def close(self) -> None:
        self.send(Disconnect())
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (OSError, ssl.SSLError):
            pass


def manifest_file(tmp_path: Path, routes: dict[str, str]) -> Path:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"schemaVersion": "1.1", "routes": routes}))
    return path


async def test_a_thousand_idle_tls_devices_cost_a_bounded_amount_each(tmp_path: Path) -> None:
    data = tmp_path / "data"
    devices = [Identity.parse(f"d{i}") for i in range(1000)]
    keys = await add_identities(data, devices)
    proc, ports = await start(data, manifest_file(tmp_path, {"all": "FROM /messages/* INTO $upstream"}))
    tls = ssl.create_default_context(cafile=str(data / "certs" / "ca.pem"))
    tls.check_hostname = False
    gate = asyncio.Semaphore(16)  # under the default pre-login cap of 32 per address

    async def login(i: Identity) -> Device:
        async with gate:
            return await Device.login(ports["tls"], i, keys[i.id], tls=tls)

    first = [await login(i) for i in devices[:50]]  # what any connection allocates once (TLS, the loop)
    base = rss_mb(proc.pid)
    rest = await asyncio.gather(*(login(i) for i in devices[50:]))
    grown = rss_mb(proc.pid) - base
    for d in [*first, *rest]:
        await d.close()
    await hub_process.stop(proc)
    # Bound: 100 KB per idle TLS connection (socket buffers, OpenSSL's state, our buffers and caches). Measured:
    # 31.7 MB for 950 (~34 KB each).
    assert grown < 950 * 0.1, f"950 idle TLS devices added {grown:.1f} MB"


async def logged_in_on_a_small_buffer(
    port: int, identity: Identity, key: str, *, keepalive_s: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``identity`` logged in over MQTT 3.1.1 on a socket with a 4 KiB receive buffer: what it leaves unread backs
    up into the hub at once."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    token = generate_sas_token(resource_uri(DEFAULT_HOST_NAME, identity), key, EXPIRY)
    user = f"{DEFAULT_HOST_NAME}/{identity.id}/?api-version=2021-04-12"
    writer.write(
        encode(Connect(identity.id, keepalive_s=keepalive_s, username=user, password=token.encode()), MQTT_311)
    )
    async with asyncio.timeout(10):
        assert (await reader.readexactly(4)) == b"\x20\x02\x00\x00"  # CONNACK, accepted
    return reader, writer


async def test_ten_thousand_connections_over_time_leave_memory_where_it_was(tmp_path: Path) -> None:
    data = tmp_path / "data"
    devices = [Identity.parse(f"d{i}") for i in range(10)]
    keys = await add_identities(data, devices)
    proc, ports = await start(data, manifest_file(tmp_path, {"all": "FROM /messages/* INTO $upstream"}))

    async def sessions(identity: Identity, count: int) -> None:
        for _ in range(count):
            d = await Device.login(ports["tcp"], identity, keys[identity.id])
            d.send(Publish(f"devices/{identity.id}/messages/events/", b"reading", 1, packet_id=1))
            assert await d.next() == PubAck(1)
            await d.close()

    await asyncio.gather(*(sessions(i, 100) for i in devices))  # 1,000: the hub's working set
    after_first = rss_mb(proc.pid)
    await asyncio.gather(*(sessions(i, 900) for i in devices))  # 9,000 more
    after_all = rss_mb(proc.pid)
    await hub_process.stop(proc)
    # Bound: 30 MB over the first thousand (the store's memtable takes the 10,000 messages too). Measured: 10 MB.
    assert after_all - after_first < 30, (
        f"RSS {after_first:.1f} MB after 1,000 connections, {after_all:.1f} after 10,000"
    )


async def test_a_module_that_never_reads_its_deliveries_is_dropped_and_its_memory_given_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    dev, sink = Identity.parse("dev1"), Identity.parse("edge/sink")
    keys = await add_identities(data, [dev, sink])
    routes = {"toSink": "FROM /messages/* INTO BrokeredEndpoint('/modules/sink/inputs/in')"}
    proc, ports = await start(data, manifest_file(tmp_path, routes))
    base = rss_mb(proc.pid)
    # The module logs in (keepalive 2 s) on a socket with a small receive buffer and then never reads.
    reader, writer = await logged_in_on_a_small_buffer(ports["tcp"], sink, keys[sink.id], keepalive_s=2)
    # 40 MB of telemetry routed to it, 200 KB a message.
    d = await Device.login(ports["tcp"], dev, keys[dev.id])
    for n in range(1, 201):
        d.send(Publish("devices/dev1/messages/events/", b"\x00" * 200_000, 1, packet_id=n))
        assert await d.next() == PubAck(n)
    peak = rss_mb(proc.pid)
    # The hub drops it (the not-reading rule: its keepalive's 3 s): its socket is closed under it.
    async with asyncio.timeout(30):
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass
    await d.close()
    after = rss_mb(proc.pid)
    writer.close()
    await hub_process.stop(proc)
    # Bound: what is in flight to it (a window of 16 x 200 KB), the write buffer and the store's memtable, not the
    # 40 MB sent. Measured: +33 MB at the peak.
    assert peak - base < 64, f"RSS {base:.1f} MB before, {peak:.1f} while it did not read"
    assert after - base < 64, f"RSS {base:.1f} MB before, {after:.1f} after it was dropped"


async def test_a_client_that_pushed_200_mb_to_a_subscription_it_never_read_gives_its_memory_back_on_closing(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    loop = Identity.parse("edge/loop")
    keys = await add_identities(data, [loop])
    # What the module sends to its output comes back to its own input: a subscription it never reads.
    routes = {"loop": "FROM /messages/modules/loop/* INTO BrokeredEndpoint('/modules/loop/inputs/in')"}
    proc, ports = await start(data, manifest_file(tmp_path, routes))
    base = rss_mb(proc.pid)
    _reader, writer = await logged_in_on_a_small_buffer(ports["tcp"], loop, keys[loop.id], keepalive_s=0)
    # 200 MB of QoS 0 publishes, 64 KB each, as fast as the hub reads them; the module reads nothing back.
    publish = encode(Publish("devices/edge/modules/loop/messages/events/", b"\x00" * 65_536), MQTT_311)
    for n in range(1, 3201):
        writer.write(publish)
        if n % 64 == 0:
            async with asyncio.timeout(60):
                await writer.drain()
    peak = rss_mb(proc.pid)
    writer.close()  # the only connection there was, and the only one that closes
    # Given back within the collector's look (a second) and its interval (5 s): polled, bounded.
    # RocksDB's memtables may keep 32 MiB of what was stored (DEFAULT_DB_WRITE_BUFFER_BYTES), and a full one keeps
    # its memory while it is flushed; freed after the collection, it would stay mapped until the next. That is the
    # likely reading of a CI run that kept 30 MB more than usual: 59.8 MB before, 160.0 at the peak, 128.8 twenty
    # seconds after the close (81 to 101 after, in 20 runs here).
    bound = base + 2 * 32 + 16
    after, deadline = rss_mb(proc.pid), time.monotonic() + 20
    while (after > bound or peak - after < 24) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        after = rss_mb(proc.pid)
    await hub_process.stop(proc)
    # Measured: base 58 MB, peak 155 MB; 156 MB still 20 s after the close before (the collector waited for 32
    # closes), 89 MB within 3 s now.
    assert peak - base > 48, f"RSS {base:.1f} MB before, {peak:.1f} at the peak: the push did not show"
    assert peak - after >= 24, f"RSS {base:.1f} MB before, {peak:.1f} at the peak, {after:.1f} after: not given back"
    assert after <= bound, f"RSS {base:.1f} MB before, {peak:.1f} at the peak, {after:.1f} after the close"
