"""Store benchmark: ingest through group commit vs raw rocksdict, drain through the executor, 1M recovery.

Usage: python -m bench.store [--messages N] [--rounds N] [--queued N] [--dir PATH]

* ingest: 8 concurrent producers enqueue 200-byte messages routed to two endpoints, fsync=always, against the
  limit measured in the same run: raw rocksdict synced write batches replaying the very groups the store wrote
  (the same keys and bytes: bodies with their properties and stamps, references, usage counters under
  ``stats/``; one batch per group, so the same group sizes). Each message is routed by a compiled Router (two
  routes, one per endpoint) before it is enqueued, as the hub's ingest does.
* drain: the executor delivers the ingested ``$upstream`` queue to a null endpoint.
* cleanup: then the executor's cleanup removes the delivered references, first of ``$upstream`` (each body stays:
  the module's queue still holds it), then, once the module's queue is committed too, of that queue (each body
  goes with it): CPU time per reference removed (the process's, writer threads included), and the longest
  time the event loop went without turning meanwhile (cleanup runs on it, a chunk at a time).
* recovery: a store holding ``--queued`` messages (default 1,000,000, routed to two endpoints) is built in a
  subprocess, then reopened in a fresh subprocess that delivers the first message; its time and peak RSS.

``EDGEHUB_BENCH_PROFILE=FILE`` profiles the last round with pyinstrument (text report to FILE; with more than
one round that round is ingest only, no drain); the profiler slows Python several times over, so read its
shares, not its rates.

Last line: one JSON object with ingest_msgs_per_s, ingest_vs_raw_ratio, drain_msgs_per_s, cleanup_us_per_ref,
cleanup_max_stall_ms, recovery_s, rss_mb_1m.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rocksdict

from edgehub.core import Message
from edgehub.delivery import EndpointExecutor, ExecutorSettings
from edgehub.routing import Router, RouteSpec
from edgehub.store import FsyncPolicy, QueueId, Store
from edgehub.store.backend import Op
from edgehub.store.codec import VERSION, RefRecord, encode_message, encode_ref, pack_u64
from edgehub.store.records import charged_size
from edgehub.store.rocks import RocksBackend, open_rocks_store
from edgehub.store.usage import STORE_WIDE, Usage, UsageBook, add
from edgehub.testing import NullEndpoint

ROUTER = Router(
    {
        "up": RouteSpec(route="FROM /messages/* INTO $upstream", priority=0),
        "mod": RouteSpec(
            route="FROM /messages/* WHERE kind = 'data' INTO BrokeredEndpoint('/modules/m/inputs/in')", priority=5
        ),
    }
)
BODY = b"x" * 200
PROPS = {"kind": "data"}
ROUTES = ROUTER.route(Message(body=BODY, properties=PROPS))
ROUTE_QUEUES = [QueueId(r.endpoint, r.priority) for r in ROUTES]
QUEUES = [q.name for q in ROUTE_QUEUES]
PRODUCERS = 8


class RecordingBackend(RocksBackend):
    """The RocksDB backend, keeping a copy of every batch written, so that the raw side replays the same bytes."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.batches: list[list[Op]] = []

    def write(self, ops: Sequence[Op], *, sync: bool) -> None:
        self.batches.append(list(ops))
        super().write(ops, sync=sync)


async def ingest(path: Path, n: int) -> tuple[float, float, Store, list[list[Op]]]:
    backend = RecordingBackend(path)
    store = Store(backend, fsync=FsyncPolicy.ALWAYS)
    per = n // PRODUCERS

    async def producer() -> None:
        for _ in range(per):
            msg = Message(body=BODY, properties=PROPS, system_properties={"connectionDeviceId": "dev1"})
            await store.enqueue(msg, ROUTER.route(msg))

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(PRODUCERS):
            tg.create_task(producer())
    dt = time.perf_counter() - t0
    group = per * PRODUCERS / max(1, store.groups_written)
    return per * PRODUCERS / dt, group, store, list(backend.batches)


def raw(path: Path, n: int, batches: list[list[Op]]) -> float:
    """Write ``batches`` (the groups the store wrote for ``n`` messages) with raw rocksdict, one synced write
    batch each; messages per second."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    names = sorted({family for ops in batches for family, _, _ in ops} | {"default"})
    db = rocksdict.Rdict(str(path), opts, column_families={k: rocksdict.Options(raw_mode=True) for k in names})
    handles = {k: db.get_column_family_handle(k) for k in names}
    wo = rocksdict.WriteOptions()
    wo.sync = True
    t0 = time.perf_counter()
    for ops in batches:
        wb = rocksdict.WriteBatch(raw_mode=True)
        for family, key, value in ops:
            if value is None:
                wb.delete(key, handles[family])
            else:
                wb.put(key, value, handles[family])
        db.write(wb, wo)
    dt = time.perf_counter() - t0
    del handles
    db.close()
    return n / dt


async def drain(store: Store, n: int) -> float:
    ep = NullEndpoint("$upstream", max_batch_messages=500)
    t0 = time.perf_counter()
    async with asyncio.timeout(600), EndpointExecutor(store, ep, settings=ExecutorSettings()) as ex:
        await ep.wait_delivered(n)
        await ex.wait_for(lambda: store.checkpoint(QueueId("$upstream", 0)).committed >= n - 1)
    return n / (time.perf_counter() - t0)


async def cleanup(store: Store, n: int) -> tuple[float, float]:
    """Clean up after ``drain``: CPU µs per reference removed, and the event loop's longest stall (ms)."""
    mod = QueueId(ROUTES[1].endpoint, ROUTES[1].priority)
    stall = 0.0
    running = True

    async def ticker() -> None:  # wakes every millisecond: how late it wakes is how long the loop stood still
        nonlocal stall
        while running:
            last = time.perf_counter()
            await asyncio.sleep(0.001)
            stall = max(stall, time.perf_counter() - last - 0.001)

    tick = asyncio.create_task(ticker())
    removed = 0
    c0 = time.process_time()
    async with EndpointExecutor(store, NullEndpoint("$upstream"), settings=ExecutorSettings()) as ex:
        removed += sum((await ex.cleanup()).values())
    await store.commit(mod, store.end_offset(mod) - 1)
    async with EndpointExecutor(store, NullEndpoint(mod.endpoint), settings=ExecutorSettings()) as ex:
        removed += sum((await ex.cleanup()).values())
    cpu = time.process_time() - c0
    running = False
    await tick
    if removed != 2 * n or store.usage() != (0, 0):
        raise RuntimeError(f"cleanup removed {removed} of {2 * n} references; left {store.usage()}")
    return cpu / removed * 1e6, stall * 1e3


def build(path: Path, n: int, *, with_counters: bool = True) -> None:
    """Write ``n`` messages routed to two endpoints in the store's own format, in large unsynced batches.

    Going through ``enqueue`` one message at a time would spend minutes building, not measuring; the records
    are the ones ``enqueue`` writes (same codec, same keys), and so are the usage counters: their ops come from
    the store's own ``UsageBook``, written with the last batch. Without them the store looks written by a build
    from before identities were counted, and its open counts every message once (an upgrade's one-time cost,
    not a restart's: ``--role build-old`` builds that store)."""
    backend = RocksBackend(path)
    book = UsageBook(backend)  # an empty store: nothing is counted at its open
    names = QUEUES
    now = time.time()
    batch = 20_000
    size = 0
    for start in range(0, n, batch):
        ops: list[Op] = []
        for i in range(start, min(n, start + batch)):
            k = pack_u64(i)
            sp = {"edgeMessageId": f"{i:032x}", "enqueuedTime": f"2026-01-01T00:00:{i % 60:02d}.{i:06d}+00:00"}
            msg = Message(body=BODY, system_properties=sp)  # distinct ids, as enqueue's UUIDs are
            ops.append(("messages", k, encode_message(msg, [(name, i) for name in names])))
            r = encode_ref(RefRecord(VERSION, i, now, 7 * 24 * 3600.0, msg.size_bytes()))
            ops.extend((name, k, r) for name in names)
            size += charged_size(msg)
        if with_counters and start + batch >= n:  # what enqueue adds: each message store-wide and per endpoint
            deltas: Usage = {}
            for key in (STORE_WIDE, *(q.endpoint for q in ROUTE_QUEUES)):
                add(deltas, key, n, size)
            ops.extend(book.ingest_tally(deltas, 0).ops)
        backend.write(ops, sync=False)
    backend.close()


async def recover(path: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    store = open_rocks_store(path)
    ep = NullEndpoint("$upstream", max_batch_messages=1)
    async with asyncio.timeout(120), EndpointExecutor(store, ep):
        await ep.wait_delivered(1)
        dt = time.perf_counter() - t0
    queued = store.end_offset(QueueId("$upstream", 0))
    await store.close()
    return {"recovery_s": dt, "rss_mb": _peak_rss_mb(), "queued": queued}


def _peak_rss_mb() -> float:
    """This process's peak RSS. Linux's VmHWM starts afresh at exec; ``ru_maxrss`` does not (it keeps the
    parent's RSS at fork, so a big benchmark parent inflated the recovery figure: 109 MB for 41 MB)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _profiler() -> Any:
    import pyinstrument  # a dev dependency: imported only when asked for

    profiler = pyinstrument.Profiler(async_mode="disabled")
    profiler.start()
    return profiler


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--queued", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--role", choices=["build", "build-old", "recover"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.messages % PRODUCERS:
        # the producers share the messages evenly; a remainder would never be sent, and the drain would wait for it
        ap.error(f"--messages must be a multiple of {PRODUCERS}, the number of producers")
    if args.role in ("build", "build-old"):
        build(args.dir, args.queued, with_counters=args.role == "build")
        return
    if args.role == "recover":
        print(json.dumps(asyncio.run(recover(args.dir))))
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        base = Path(tmp)

        cleaned = (0.0, 0.0)

        async def run_ingest(path: Path, with_drain: bool) -> tuple[float, float, float, list[list[Op]]]:
            nonlocal cleaned
            rate, group, store, batches = await ingest(path, args.messages)
            try:
                drained = 0.0
                if with_drain:
                    drained = await drain(store, args.messages)
                    cleaned = await cleanup(store, args.messages)
            finally:
                await store.close()
            return rate, group, drained, batches

        # The disk is shared and its sync latency drifts: alternate the two sides and compare medians.
        ingest_rates: list[float] = []
        raw_rates: list[float] = []
        drain_rate = 0.0
        profile = os.environ.get("EDGEHUB_BENCH_PROFILE")
        for r in range(args.rounds):
            profiler = _profiler() if profile and r == args.rounds - 1 else None
            rate, group, drained, batches = asyncio.run(run_ingest(base / f"ingest{r}", r == 0))
            if profiler is not None and profile:
                profiler.stop()
                Path(profile).write_text(profiler.output_text(show_all=True))
            drain_rate = drained or drain_rate
            raw_rate = raw(base / f"raw{r}", args.messages, batches)
            ingest_rates.append(rate)
            raw_rates.append(raw_rate)
            size = sum(len(b) for b in batches) / len(batches)
            nbytes = sum(len(k) + len(v or b"") for b in batches for _, k, v in b) / len(batches)
            n_batches = len(batches)
            del batches
            print(
                f"round {r}: ingest {rate:8.0f} msg/s (mean group {group:.1f})"
                f"  raw {raw_rate:8.0f} msg/s (the same {n_batches} batches: {size:.1f} ops, {nbytes:.0f} B each)"
            )
        ingest_rate = statistics.median(ingest_rates)
        raw_rate = statistics.median(raw_rates)
        print(f"ingest  {ingest_rate:10.0f} msg/s  (median; 8 producers, fsync=always)")
        print(f"raw     {raw_rate:10.0f} msg/s  (median; rocksdict synced batches of the same groups and bytes)")
        print(f"drain   {drain_rate:10.0f} msg/s  (executor -> null endpoint)")
        print(
            f"cleanup {cleaned[0]:10.1f} us CPU per reference removed;"
            f" the event loop stood still {cleaned[1]:.1f} ms at most"
        )
        t0 = time.perf_counter()
        here = [sys.executable, "-m", "bench.store", "--dir", str(base / "big"), "--queued", str(args.queued)]
        subprocess.run([*here, "--role", "build"], check=True)
        print(f"built   {args.queued} queued messages in {time.perf_counter() - t0:.1f} s")
        out = subprocess.run([*here, "--role", "recover"], check=True, capture_output=True, text=True).stdout
        rec = json.loads(out.strip().splitlines()[-1])
        if rec["queued"] != args.queued:
            raise RuntimeError(f"the reopened store holds {rec['queued']} of the {args.queued} messages built")
        print(
            f"recover {rec['recovery_s']:.3f} s to first delivery of {rec['queued']} queued; "
            f"peak RSS {rec['rss_mb']:.1f} MB"
        )
        print(
            json.dumps(
                {
                    "ingest_msgs_per_s": round(ingest_rate),
                    "ingest_vs_raw_ratio": round(ingest_rate / raw_rate, 3),
                    "drain_msgs_per_s": round(drain_rate),
                    "cleanup_us_per_ref": round(cleaned[0], 1),
                    "cleanup_max_stall_ms": round(cleaned[1], 1),
                    "recovery_s": round(rec["recovery_s"], 3),
                    "rss_mb_1m": round(rec["rss_mb"], 1),
                }
            )
        )


if __name__ == "__main__":
    main()
