"""A damaged store, made for real on a store ``edgehub run`` wrote, through the real command line.

A hub process takes ``N`` acknowledged messages from a paho device and is SIGKILLed: the crash image (the
messages in the WAL only). Its flushed twin (the same store closed cleanly, the messages in tables) is the
other base. On copies of them: a flipped byte in a table file, a WAL truncated below what was synced, a
missing MANIFEST (CURRENT names nothing), a WAL corrupted in the middle, a missing CURRENT, and a torn last write
(which must still open). For each damage
``edgehub run`` refuses to start (exit 1, no traceback, the damage, the path and the recovery said, the store
untouched), ``edgehub store check`` says damaged (exit 1), ``edgehub store repair`` recovers what can be read
(the store as found kept aside) and the hub starts again.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgehub.store.rocks import WAL_MARK, RocksBackend
from tests.e2e.hub_process import EDGEHUB, identity_add, kill_leftovers, start, stop
from tests.protocol_heads.mqtt.conftest import Paho

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

N = 300
ROUTES = {"schemaVersion": "1.1", "routes": {"toF": "FROM /messages/* INTO BrokeredEndpoint('/modules/f/inputs/in')"}}


@dataclass(frozen=True)
class Images:
    crash: Path  # a data folder whose store holds the messages in its WAL only (the hub was SIGKILLed)
    flushed: Path  # the same store closed cleanly: the messages in table files
    manifest: Path
    acked: int


async def _publish_until_marked(data: Path, manifest: Path) -> int:
    """Run the hub, publish N acknowledged messages, keep publishing one at a time until the WAL mark covers the
    WAL as it was after the N (the mark is written at most once a second), then SIGKILL the hub. The acks."""
    cs = await identity_add(data, "dev1")
    proc, port, _ = await start(data, manifest)
    dev = Paho.make("dev1")
    try:
        user = f"{cs.host_name}/dev1/?api-version=2021-04-12"
        assert (
            await dev.connect(
                port, tls_ca=data / "certs" / "ca.pem", user=user, password=cs.sas_token(int(time.time()) + 86_400)
            )
            == 0
        )
        acked = 0
        for i in range(N):
            dev.publish("devices/dev1/messages/events/", b"m%04d" % i + b"x" * 100)
        async with asyncio.timeout(30):
            for _ in range(N):
                assert (await dev.publishes.get())[1] == 0
                acked += 1
            wal = max((p for p in (data / "store").glob("*.log")), key=lambda p: int(p.stem))
            size = wal.stat().st_size
            while True:
                mark = (data / "store" / WAL_MARK).read_text().split()
                if mark[0] == wal.name and int(mark[1]) >= size:
                    break
                dev.publish("devices/dev1/messages/events/", b"more")
                assert (await dev.publishes.get())[1] == 0
                acked += 1
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        kill_leftovers()
        await dev.close()
    return acked


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Images:
    base = tmp_path_factory.mktemp("hub-written")
    manifest = base / "m.json"
    manifest.write_text(json.dumps(ROUTES))
    crash = base / "crash"
    acked = asyncio.run(_publish_until_marked(crash, manifest))
    flushed = base / "flushed"
    shutil.copytree(crash, flushed)
    RocksBackend(flushed / "store").close()  # replays the WAL into a table, then flushes: as a clean stop does
    assert list((flushed / "store").glob("*.sst"))
    return Images(crash, flushed, manifest, acked)


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edgehub(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EDGEHUB, *args], capture_output=True, text=True, timeout=60, check=False)


def snapshot(store: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(store.iterdir()) if p.is_file() and not p.name.startswith("LOG")}


def message_bodies(output: str) -> int:
    m = re.search(r"(\d+) message bodies", output)
    assert m, output
    return int(m.group(1))


def assert_run_refuses(data: Path, manifest: Path, damage: str) -> None:
    """``edgehub run`` exits 1 at once, saying the damage, the path and the recovery, and changes nothing."""
    before = snapshot(data / "store")
    run = edgehub("run", "--manifest", str(manifest), "--data-dir", str(data), "--mqtts-port", "0", "--amqps-port", "0")
    assert run.returncode == 1, run
    assert "Traceback" not in run.stderr
    assert "listening" not in run.stdout
    assert f"the store at {data / 'store'} is damaged" in run.stderr
    assert damage in run.stderr
    assert f"edgehub store repair --data-dir {data}" in run.stderr
    assert f"edgehub store check --data-dir {data}" in run.stderr
    assert snapshot(data / "store") == before  # nothing written, nothing dropped: repair still has it all
    check = edgehub("store", "check", "--data-dir", str(data))
    assert check.returncode == 1, check
    assert check.stdout.startswith("damaged: ")
    assert damage in check.stdout


def repair_and_start(data: Path, manifest: Path) -> str:
    """``edgehub store repair`` (the store as found kept aside, whole), a clean check, and the hub starts."""
    found = snapshot(data / "store")
    rep = edgehub("store", "repair", "--data-dir", str(data))
    assert rep.returncode == 0, rep
    [aside] = [p for p in data.iterdir() if p.name.startswith("store.damaged-")]
    assert snapshot(aside) == found
    check = edgehub("store", "check", "--data-dir", str(data))
    assert check.returncode == 0, check
    assert check.stdout.startswith("ok: ")
    assert message_bodies(check.stdout) == message_bodies(rep.stdout.split("recovered into")[1])

    async def starts() -> None:
        proc, _, _ = await start(data, manifest)
        await stop(proc)

    asyncio.run(starts())
    return rep.stdout


def test_a_flipped_byte_in_a_table_is_refused_and_repair_skips_only_its_block(images: Images, tmp_path: Path) -> None:
    data = copy(images.flushed, tmp_path / "data")
    table = max((data / "store").glob("*.sst"), key=lambda p: p.stat().st_size)
    raw = bytearray(table.read_bytes())
    raw[len(raw) // 3] ^= 0x10
    table.write_bytes(bytes(raw))
    assert_run_refuses(data, images.manifest, "block checksum mismatch")
    out = repair_and_start(data, images.manifest)
    assert "skipped damaged records: messages:" in out or "skipped damaged records: q:" in out
    recovered = message_bodies(out.split("recovered into")[1])
    assert images.acked - 50 < recovered < images.acked  # one 4 KiB block lost, not the table


def test_a_truncated_wal_is_refused_and_repair_keeps_what_it_still_holds(images: Images, tmp_path: Path) -> None:
    data = copy(images.crash, tmp_path / "data")
    name, synced = (data / "store" / WAL_MARK).read_text().split()
    os.truncate(data / "store" / name, int(synced) // 2)
    assert_run_refuses(data, images.manifest, f"the write-ahead log {name} is {int(synced) // 2} bytes")
    out = repair_and_start(data, images.manifest)
    assert 0 < message_bodies(out.split("recovered into")[1]) < images.acked


def test_a_missing_manifest_is_refused_and_repair_rebuilds_it_with_every_message(
    images: Images, tmp_path: Path
) -> None:
    data = copy(images.flushed, tmp_path / "data")
    [manifest_file] = (data / "store").glob("MANIFEST-*")
    manifest_file.unlink()
    assert_run_refuses(data, images.manifest, f"CURRENT names '{manifest_file.name}', which is missing")
    out = repair_and_start(data, images.manifest)
    assert "the MANIFEST was rebuilt" in out
    assert message_bodies(out.split("recovered into")[1]) == images.acked


def test_a_wal_corrupted_in_the_middle_is_refused_not_replayed_up_to_the_damage(images: Images, tmp_path: Path) -> None:
    """RocksDB's default recovery (point in time) would open this store with every write after the damage gone."""
    data = copy(images.crash, tmp_path / "data")
    wal = max((data / "store").glob("*.log"), key=lambda p: int(p.stem))
    raw = bytearray(wal.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    wal.write_bytes(bytes(raw))
    assert_run_refuses(data, images.manifest, "Corruption: checksum mismatch")
    out = repair_and_start(data, images.manifest)
    assert 0 < message_bodies(out.split("recovered into")[1]) < images.acked


def test_a_missing_current_is_refused_rather_than_started_as_a_new_empty_store(images: Images, tmp_path: Path) -> None:
    data = copy(images.flushed, tmp_path / "data")
    (data / "store" / "CURRENT").unlink()
    assert_run_refuses(data, images.manifest, "CURRENT is missing, yet")
    out = repair_and_start(data, images.manifest)
    assert message_bodies(out.split("recovered into")[1]) == images.acked


def test_a_torn_last_write_still_opens_with_every_acknowledged_message(images: Images, tmp_path: Path) -> None:
    """What a power cut leaves: the last WAL record cut short, past everything that was synced (and acked)."""
    data = copy(images.crash, tmp_path / "data")
    wal = max((data / "store").glob("*.log"), key=lambda p: int(p.stem))
    with wal.open("ab") as f:
        f.write(b"\x01\x02\x03\x04" + (500).to_bytes(2, "little") + b"\x01" + b"cut short")  # header says 500 bytes
    check = edgehub("store", "check", "--data-dir", str(data))
    assert check.returncode == 0, check
    assert message_bodies(check.stdout) == images.acked

    async def starts() -> None:
        proc, _, _ = await start(data, images.manifest)
        await stop(proc)

    asyncio.run(starts())


def test_check_and_repair_refuse_a_store_a_running_hub_holds(images: Images, tmp_path: Path) -> None:
    data = copy(images.flushed, tmp_path / "data")

    async def while_running() -> None:
        proc, _, _ = await start(data, images.manifest)
        try:
            for verb in ("check", "repair"):
                res = await asyncio.to_thread(edgehub, "store", verb, "--data-dir", str(data))
                assert res.returncode == 2, res
                assert "in use: a running hub holds its LOCK; stop the hub first" in res.stderr
                assert "Traceback" not in res.stderr
        finally:
            await stop(proc)

    asyncio.run(while_running())
    assert not [p for p in data.iterdir() if p.name.startswith("store.damaged-")]
    check = edgehub("store", "check", "--data-dir", str(data))
    assert check.returncode == 0, check
    assert message_bodies(check.stdout) == images.acked


def test_check_and_repair_say_there_is_no_store_rather_than_create_one(tmp_path: Path) -> None:
    for verb in ("check", "repair"):
        res = edgehub("store", verb, "--data-dir", str(tmp_path / "data"))
        assert res.returncode == 2, res
        assert f"there is no store at {tmp_path / 'data' / 'store'}" in res.stderr
        assert "Traceback" not in res.stderr
    assert not (tmp_path / "data").exists()
