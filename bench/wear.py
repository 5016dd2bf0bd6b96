"""Bytes written to storage per message stored, by fsync policy: what a profile's fsync choice costs an SD card.

Usage: python -m bench.wear [--profile pi-zero2w] [--seconds 5] [--dir PATH] [--no-loop]

For each fsync policy (always, interval at the profile's interval, none) and three rates (20, 200 and 2,000
messages a second from 50 devices, each on its own schedule, 200-byte bodies), the store (real RocksDB, the
profile's memory budget) takes messages for ``--seconds``, then is closed (its memtables flushed to a table, as a
queued backlog would be sooner or later). At a low rate each message is a group of its own, so under ``always``
it pays a sync of its own; at a high rate a sync is shared by the messages that arrived while the last one ran.

Figures per message:
* ``page_bytes``: the process's ``write_bytes`` (/proc/self/io): Linux counts a page (4 KiB) each time a clean
  page of the page cache is dirtied, so a WAL page synced and then appended to again counts again: this follows
  how often the same flash page is rewritten, not only how many bytes the WAL grew by;
* ``device_bytes`` (as root, when a loop device can be set up; ``--no-loop`` skips it): the sectors written to a
  private ext4 file system on a loop device that only this run uses, journal and metadata included; the closest
  to what the card receives (its own flash translation layer multiplies it again, by a factor only the card
  knows);
* ``flush_device_bytes``: what the close wrote on top (the memtable's table, for messages still queued);
* ``syncs``: the WAL syncs made per message.

Last line: one JSON object, ``{policy: {rate: {msgs, page_bytes, device_bytes, flush_device_bytes, syncs}}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgehub.core import Message
from edgehub.routing import Router, RouteSpec
from edgehub.runtime.profiles import Profile, load_profile
from edgehub.store import FsyncPolicy, Store
from edgehub.store.backend import Op
from edgehub.store.rocks import RocksBackend

ROUTER = Router({"up": RouteSpec(route="FROM /messages/* INTO $upstream", priority=5)})
BODY = b"x" * 200
PROPS = {"kind": "telemetry"}
RATES = (20, 200, 2000)  # messages a second from 50 devices together: a few sensors, a busy site, a burst


class CountingBackend(RocksBackend):
    """The RocksDB backend, counting the WAL syncs it makes."""

    syncs = 0

    def write(self, ops: Sequence[Op], *, sync: bool) -> None:
        super().write(ops, sync=sync)
        self.syncs += sync

    def sync_wal(self) -> None:
        super().sync_wal()
        self.syncs += 1


def _write_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("no write_bytes in /proc/self/io")


class LoopDisk:
    """A private ext4 file system on a loop device: the sectors written to it are this run's alone."""

    def __init__(self, image: Path, mountpoint: Path) -> None:
        subprocess.run(["truncate", "-s", "512M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
        self.device = subprocess.run(
            ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
        ).stdout.strip()
        mountpoint.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(["mount", self.device, str(mountpoint)], check=True, capture_output=True)
        except subprocess.CalledProcessError:
            subprocess.run(["losetup", "-d", self.device], check=False)
            raise
        self.mountpoint = mountpoint

    def sectors_written(self) -> int:
        # /sys/block/loopN/stat: field 7 is sectors written (512 bytes each)
        return int(Path(f"/sys/block/{Path(self.device).name}/stat").read_text().split()[6])

    def close(self) -> None:
        subprocess.run(["umount", str(self.mountpoint)], check=False)
        subprocess.run(["losetup", "-d", self.device], check=False)


@contextlib.contextmanager
def storage(base: Path, use_loop: bool) -> Iterator[tuple[Path, LoopDisk | None, str]]:
    """Where the stores go: a loop-mounted ext4 if it can be had, else ``base``; and why not, if not."""
    if use_loop and os.geteuid() == 0:
        try:
            disk = LoopDisk(base / "disk.img", base / "mnt")
        except (OSError, subprocess.CalledProcessError) as exc:
            yield base, None, f"no loop device: {exc}"
            return
        try:
            yield disk.mountpoint, disk, ""
        finally:
            disk.close()
        return
    yield base, None, "not root" if use_loop else "--no-loop"


async def run(path: Path, profile: Profile, rate: float, seconds: float, disk: LoopDisk | None) -> dict[str, Any]:
    """Devices sending ``rate`` messages a second in all, each on its own schedule (not in step), for ``seconds``;
    bytes written while they send (the WAL, with its syncs) and then by the close (the memtables flushed)."""
    backend = CountingBackend(path, tuning=profile.rocks)
    store = Store(
        backend, fsync=profile.fsync, fsync_interval_ms=profile.fsync_interval_ms, max_group=profile.max_group
    )
    devices = 50
    period_s = devices / rate
    rng = random.Random(7)
    pending: set[asyncio.Task[Any]] = set()
    sent = 0

    def point() -> tuple[int, int]:
        os.sync()  # what the page cache still holds goes to the device now, so it is counted in this phase
        return _write_bytes(), disk.sectors_written() * 512 if disk else 0

    async def device(phase_s: float, until: float) -> None:
        nonlocal sent
        await asyncio.sleep(phase_s)
        while time.monotonic() < until:
            msg = Message(body=BODY, properties=PROPS, system_properties={"connectionDeviceId": "dev1"})
            # a device with QoS 1 sends its next message on time whether or not the last one was acked yet
            task = asyncio.create_task(store.enqueue(msg, ROUTER.route(msg)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
            await asyncio.sleep(period_s * rng.uniform(0.9, 1.1))

    start = point()
    until = time.monotonic() + seconds
    async with asyncio.TaskGroup() as tg:
        for _ in range(devices):
            tg.create_task(device(rng.uniform(0, period_s), until))
    await asyncio.gather(*pending)
    syncs = backend.syncs
    ingested = point()
    await store.close()  # the memtables flushed to a table: a backlog's bytes written a second time
    closed = point()
    return {
        "msgs": sent,
        "page_bytes": round((ingested[0] - start[0]) / sent, 1),
        "device_bytes": round((ingested[1] - start[1]) / sent, 1) if disk else None,
        "flush_device_bytes": round((closed[1] - ingested[1]) / sent, 1) if disk else None,
        "syncs": round(syncs / sent, 4),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="pi-zero2w")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--no-loop", action="store_true", help="measure on --dir's file system, without a loop device")
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, storage(Path(tmp), not args.no_loop) as (base, disk, why):
        print(f"profile {profile.name}; storage: {'a private ext4 on ' + disk.device if disk else base} {why}")
        for policy in FsyncPolicy:
            p = replace(profile, fsync=policy)
            label = f"interval_{p.fsync_interval_ms}ms" if policy is FsyncPolicy.INTERVAL else policy.value
            results[label] = {}
            for rate in RATES:
                r = asyncio.run(run(base / f"{label}-{rate}", p, rate, args.seconds, disk))
                results[label][f"{rate}/s"] = r
                device = "-" if disk is None else f"{r['device_bytes']:8.0f}  flush {r['flush_device_bytes']:5.0f}"
                print(
                    f"{label:16s} {rate:5d} msg/s {r['msgs']:6d} msgs  page bytes/msg {r['page_bytes']:7.0f}  "
                    f"device bytes/msg {device}  syncs/msg {r['syncs']:.3f}"
                )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
