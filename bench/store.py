"""Store benchmark: ingest through group commit vs raw rocksdict, drain through the executor, 1M recovery.

Usage: python -m bench.store [--messages N] [--rounds N] [--queued N] [--dir PATH]

* ingest: 8 concurrent producers enqueue 200-byte messages routed to two endpoints, fsync=always, against the
  limit measured in the same run: raw rocksdict synced write batches of the same group size writing the same
  records (one body and two references per message). Each message is routed by a compiled Router (two routes,
  one per endpoint) before it is enqueued, as the hub's ingest does.
* drain: the executor delivers the ingested ``$upstream`` queue to a null endpoint.
* recovery: a store holding ``--queued`` messages (default 1,000,000, routed to two endpoints) is built in a
  subprocess, then reopened in a fresh subprocess that delivers the first message; its time and peak RSS.

Last line: one JSON object with ingest_msgs_per_s, ingest_vs_raw_ratio, drain_msgs_per_s, recovery_s, rss_mb_1m.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import rocksdict

from edgehub.core import Message
from edgehub.delivery import EndpointExecutor, ExecutorSettings
from edgehub.routing import Router, RouteSpec
from edgehub.store import FsyncPolicy, QueueId, Store
from edgehub.store.codec import VERSION, RefRecord, encode_message, encode_ref, pack_u64
from edgehub.store.rocks import RocksBackend, open_rocks_store
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
QUEUES = [QueueId(r.endpoint, r.priority).name for r in ROUTES]
PRODUCERS = 8


async def ingest(path: Path, n: int) -> tuple[float, float, Store]:
    store = open_rocks_store(path, fsync=FsyncPolicy.ALWAYS)
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
    return per * PRODUCERS / dt, group, store


def raw(path: Path, n: int, group: int) -> float:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    names = ["messages", *QUEUES]
    db = rocksdict.Rdict(str(path), opts, column_families={k: rocksdict.Options(raw_mode=True) for k in names})
    handles = [db.get_column_family_handle(k) for k in names]
    wo = rocksdict.WriteOptions()
    wo.sync = True
    msg = Message(body=BODY, system_properties={"edgeMessageId": "0" * 32, "enqueuedTime": "2026-01-01T00:00:00+00:00"})
    body = encode_message(msg, [(q, 0) for q in QUEUES])
    ref = encode_ref(RefRecord(VERSION, 0, 0.0, 7200.0, 200))
    t0 = time.perf_counter()
    i = 0
    while i < n:
        wb = rocksdict.WriteBatch(raw_mode=True)
        for j in range(i, min(n, i + group)):
            k = pack_u64(j)
            wb.put(k, body, handles[0])
            wb.put(k, ref, handles[1])
            wb.put(k, ref, handles[2])
        db.write(wb, wo)
        i += group
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


def build(path: Path, n: int) -> None:
    """Write ``n`` messages routed to two endpoints in the store's own format, in large unsynced batches.

    Going through ``enqueue`` one message at a time would spend minutes building, not measuring; the records
    are the ones ``enqueue`` writes (same codec, same keys), only the usage counters are left out (they are a
    handful of keys read at open, so their absence does not change the measure)."""
    backend = RocksBackend(path)
    names = QUEUES
    now = time.time()
    batch = 20_000
    for start in range(0, n, batch):
        ops: list[tuple[str, bytes, bytes | None]] = []
        for i in range(start, min(n, start + batch)):
            k = pack_u64(i)
            sp = {"edgeMessageId": f"{i:032x}", "enqueuedTime": f"2026-01-01T00:00:{i % 60:02d}.{i:06d}+00:00"}
            msg = Message(body=BODY, system_properties=sp)  # distinct ids, as enqueue's UUIDs are
            ops.append(("messages", k, encode_message(msg, [(name, i) for name in names])))
            r = encode_ref(RefRecord(VERSION, i, now, 7 * 24 * 3600.0, msg.size_bytes()))
            ops.extend((name, k, r) for name in names)
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
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"recovery_s": dt, "rss_mb": rss_mb, "queued": queued}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--queued", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--role", choices=["build", "recover"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "build":
        build(args.dir, args.queued)
        return
    if args.role == "recover":
        print(json.dumps(asyncio.run(recover(args.dir))))
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        base = Path(tmp)

        async def run_ingest(path: Path, with_drain: bool) -> tuple[float, float, float]:
            rate, group, store = await ingest(path, args.messages)
            try:
                drained = await drain(store, args.messages) if with_drain else 0.0
            finally:
                await store.close()
            return rate, group, drained

        # The disk is shared and its sync latency drifts: alternate the two sides and compare medians.
        ingest_rates: list[float] = []
        raw_rates: list[float] = []
        drain_rate = 0.0
        for r in range(args.rounds):
            rate, group, drained = asyncio.run(run_ingest(base / f"ingest{r}", r == 0))
            drain_rate = drained or drain_rate
            size = max(1, round(group))
            raw_rate = raw(base / f"raw{r}", args.messages, size)
            ingest_rates.append(rate)
            raw_rates.append(raw_rate)
            print(
                f"round {r}: ingest {rate:8.0f} msg/s (mean group {group:.1f})"
                f"  raw {raw_rate:8.0f} msg/s (batches of {size})"
            )
        ingest_rate = statistics.median(ingest_rates)
        raw_rate = statistics.median(raw_rates)
        print(f"ingest  {ingest_rate:10.0f} msg/s  (median; 8 producers, fsync=always)")
        print(f"raw     {raw_rate:10.0f} msg/s  (median; rocksdict synced batches of the same group size)")
        print(f"drain   {drain_rate:10.0f} msg/s  (executor -> null endpoint)")
        t0 = time.perf_counter()
        here = [sys.executable, "-m", "bench.store", "--dir", str(base / "big"), "--queued", str(args.queued)]
        subprocess.run([*here, "--role", "build"], check=True)
        print(f"built   {args.queued} queued messages in {time.perf_counter() - t0:.1f} s")
        out = subprocess.run([*here, "--role", "recover"], check=True, capture_output=True, text=True).stdout
        rec = json.loads(out.strip().splitlines()[-1])
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
                    "recovery_s": round(rec["recovery_s"], 3),
                    "rss_mb_1m": round(rec["rss_mb"], 1),
                }
            )
        )


if __name__ == "__main__":
    main()
