"""How long a synced store write stops the event loop: the backend's write + ``flush_wal(True)`` against
rocksdict's ``write`` with ``sync=True`` (what the backend did before), in the same run, on the same disk.

``python -m bench.store_sync [--writes 1000] [--ops 45] [--dir PATH]``

A writer thread (as the store's ``WriterThread``) makes ``--writes`` synced writes of ``--ops`` puts of 300 bytes
(about one ingest group of 22 messages) back to back, while the main thread runs an asyncio loop that does
nothing but come round. Reported per mode: writes/s, and the loop's stalls (rounds that took over 0.2 ms): their
total per write and their p99. rocksdict holds the GIL through ``write``, fsync included, and lets go of it in
``flush_wal``; see ``edgehub/store/rocks.py``. ``--dir`` should be on the disk the hub's data is on (the default
is a temporary folder under the current directory; a tmpfs syncs for free). Last line: JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import rocksdict

from edgehub.store.rocks import RocksBackend

VALUE = b"v" * 300


def backend_writer(path: Path, ops: int) -> tuple[Callable[[int], None], Callable[[], None]]:
    backend = RocksBackend(path)
    backend.ensure_family("bench")

    def write(i: int) -> None:
        backend.write([("bench", b"%d-%d" % (i, j), VALUE) for j in range(ops)], sync=True)

    return write, backend.close


def sync_option_writer(path: Path, ops: int) -> tuple[Callable[[int], None], Callable[[], None]]:
    db = rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True))
    synced = rocksdict.WriteOptions()
    synced.sync = True

    def write(i: int) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for j in range(ops):
            batch.put(b"%d-%d" % (i, j), VALUE)
        db.write(batch, synced)

    return write, db.close


async def measure(write: Callable[[int], None], writes: int) -> dict[str, float]:
    done = threading.Event()
    elapsed = 0.0

    def run() -> None:
        nonlocal elapsed
        t0 = time.perf_counter()
        for i in range(writes):
            write(i)
        elapsed = time.perf_counter() - t0
        done.set()

    stalls: list[float] = []
    thread = threading.Thread(target=run, name="bench-writer")
    last = time.perf_counter()
    thread.start()
    while not done.is_set():
        await asyncio.sleep(0)
        now = time.perf_counter()
        if now - last > 0.0002:
            stalls.append(now - last)
        last = now
    thread.join()
    stalls.sort()
    return {
        "writes_per_s": writes / elapsed,
        "stall_ms_per_write": sum(stalls) / writes * 1e3,
        "stall_p99_ms": stalls[int(len(stalls) * 0.99)] * 1e3 if stalls else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writes", type=int, default=1000)
    ap.add_argument("--ops", type=int, default=45)
    ap.add_argument("--dir", type=Path, default=Path.cwd())
    args = ap.parse_args()
    sys.setswitchinterval(0.0001)  # so that the loop runs as soon as the GIL is free, not 5 ms later
    results: dict[str, dict[str, float]] = {}
    work = Path(tempfile.mkdtemp(prefix="bench-store-sync-", dir=args.dir))
    try:
        for name, make in (("sync_option", sync_option_writer), ("flush_wal", backend_writer)):
            write, close = make(work / name, args.ops)
            try:
                results[name] = asyncio.run(measure(write, args.writes))
            finally:
                close()
            r = results[name]
            print(
                f"{name:12s} {r['writes_per_s']:7.0f} writes/s; the loop stalled "
                f"{r['stall_ms_per_write']:.3f} ms per write (p99 stall {r['stall_p99_ms']:.2f} ms)"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    old, new = results["sync_option"], results["flush_wal"]
    print(
        json.dumps(
            {
                "flush_wal_writes_per_s": round(new["writes_per_s"], 1),
                "sync_option_writes_per_s": round(old["writes_per_s"], 1),
                "flush_wal_stall_ms_per_write": round(new["stall_ms_per_write"], 3),
                "sync_option_stall_ms_per_write": round(old["stall_ms_per_write"], 3),
                "stall_ratio": round(new["stall_ms_per_write"] / old["stall_ms_per_write"], 3)
                if old["stall_ms_per_write"]
                else None,
            }
        )
    )


if __name__ == "__main__":
    main()
