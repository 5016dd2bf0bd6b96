"""python -m bench.demo (``make demo``): the whole path through a thin link with an outage, in about 4 minutes.

Usage::

    python -m bench.demo [--out demo-out] [--devices 10] [--warm-s 20] [--outage-s 60] [--after-s 30] \\
        [--rate 64kbit] [--no-spark] [--no-plot]

What runs (all on 127.0.0.1, real parts):

1. ``--devices`` simulated devices (paho, MQTT 3.1.1, QoS 1) publish telemetry every second (a JSON body of a
   dozen readings, application property ``kind=telemetry``) and, now and then (3 % of ticks), an alert
   (``kind=alert``);
2. the hub (``serve`` of ``edgehub.runtime``, RocksDB store in ``OUT/data``) routes alerts to ``$upstream`` at
   priority 0 (TTL a day) and telemetry at priority 5 with a TTL of ``--telemetry-ttl-s`` (45 s), so telemetry
   held through a 60 s outage partly expires, as a gateway's would;
3. its MQTT upstream (batch mode: gzip'ed segments, priority-strict) goes through the link simulator
   (``edgehub.testing.linksim``) at ``--rate`` each way, 150 ms one way, to a cloud Mosquitto; the link is up for
   ``--warm-s``, silent (no FIN, no RST) for ``--outage-s``, up again for ``--after-s`` while the devices go on;
4. the landing receiver (``spark_upload.receiver``) lands every segment in ``OUT/landing``;
5. the devices stop, the hub drains, and the Spark job runs once (``available-now``) into ``OUT/lake``.

It prints one table per priority: sent (acknowledged by the hub), delivered (rows in the lake's bronze table),
expired (TTL at the edge: sent less delivered less what is still queued; the hub's own TTL count is printed
beside), and latency p50/p99 from the device's publish to the segment's landing, over what was delivered; and
writes ``OUT/demo.png`` (matplotlib, ``pip install -e '.[demo]'``): queue depth per priority and uplink use over
time, the outage shaded. The last line is JSON with the same figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from bench.demo_report import PriorityFigures, lake_rows_per_priority, plot, table
from edgehub.core import Identity
from edgehub.hub.facade import EdgeHub
from edgehub.runtime.compose.config import DEFAULT_HOST_NAME, HubConfig
from edgehub.runtime.compose.serve import serve
from edgehub.runtime.compose.store import open_identities, open_store
from edgehub.store import QueueId, RemovalReason
from edgehub.testing.linksim import LinkSim, parse_rate_bps
from edgehub.testing.peers import MosquittoPeer, PeerWay
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.segment import decode_segment
from spark_upload.receiver import Received, Receiver, ReceiverSettings

DELAY_S = 0.15  # one way
SAMPLE_S = 0.5
PRIORITIES = (0, 5)
ALERT_CHANCE = 0.03


@dataclass(frozen=True)
class Scenario:
    devices: int = 10
    warm_s: float = 20.0
    outage_s: float = 60.0
    after_s: float = 30.0
    rate_bps: float = 64_000.0
    telemetry_ttl_s: int = 45
    drain_timeout_s: float = 60.0
    seed: int = 7


@dataclass
class Samples:
    """Every ``SAMPLE_S``: time since start, queue depth per priority, bytes the link carried up so far."""

    t: list[float] = field(default_factory=list)
    depth: dict[int, list[int]] = field(default_factory=lambda: {p: [] for p in PRIORITIES})
    up_bytes: list[int] = field(default_factory=list)


class Device:
    """A paho device: ``publish`` is QoS 1; ``sent`` counts the PUBACKs per priority."""

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=name)
        self.client.username_pw_set(name, "pw")
        self.client.max_queued_messages_set(0)
        self.sent: dict[int, int] = {p: 0 for p in PRIORITIES}
        self._pending: dict[int, int] = {}
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self.client.on_connect = lambda c, u, f, rc, p: self._connected.set()
        self.client.on_publish = self._on_publish
        self.port = port

    def _on_publish(self, c: paho.Client, u: Any, mid: int, rc: Any, props: Any) -> None:
        with self._lock:
            priority = self._pending.pop(mid, None)
            if priority is not None:
                self.sent[priority] += 1

    async def start(self) -> None:
        await asyncio.to_thread(self.client.connect, "127.0.0.1", self.port, 30)
        self.client.loop_start()
        if not await asyncio.to_thread(self._connected.wait, 20):
            raise RuntimeError(f"{self.name} did not connect")

    def publish(self, kind: str, body: dict[str, Any]) -> None:
        priority = 0 if kind == "alert" else 5
        with self._lock:
            info = self.client.publish(f"devices/{self.name}/messages/events/kind={kind}", json.dumps(body), qos=1)
            self._pending[info.mid] = priority

    def unacked(self) -> int:
        with self._lock:
            return len(self._pending)

    async def stop(self) -> None:
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)


def manifest(path: Path, telemetry_ttl_s: int) -> None:
    routes = {
        "alerts": {"route": "FROM /messages/* WHERE kind = 'alert' INTO $upstream", "priority": 0},
        "telemetry": {
            "route": "FROM /messages/* WHERE kind = 'telemetry' INTO $upstream",
            "priority": 5,
            "timeToLiveSecs": telemetry_ttl_s,
        },
    }
    path.write_text(json.dumps({"schemaVersion": "1.1", "routes": routes, "storeAndForwardConfiguration": {}}))


def reading(device: str, n: int, rnd: random.Random) -> dict[str, Any]:
    return {
        "device": device,
        "seq": n,
        "sent_at": time.time(),
        "temperature": round(rnd.uniform(15, 35), 2),
        "pressure": round(rnd.uniform(0.9, 1.2), 4),
        "vibration": [round(rnd.uniform(0, 1), 3) for _ in range(8)],
    }


class Landed:
    """The receiver's landings: each landed segment's records with the wall-clock time it landed (the receiver
    calls from its own thread; the segments are a few KB, decoded as they land)."""

    def __init__(self, landing: Path) -> None:
        self.landing = landing
        self._records: dict[str, tuple[int, float, float]] = {}
        self._lock = threading.Lock()

    def __call__(self, received: Received) -> None:
        if received.outcome not in ("written", "already_present"):
            return
        landed_at = time.time()
        records = decode_segment((self.landing / received.path).read_bytes())
        with self._lock:
            for r in records:
                self._records.setdefault(r.edge_message_id, (r.priority, json.loads(r.body)["sent_at"], landed_at))

    def records(self) -> dict[str, tuple[int, float, float]]:
        """edge message id -> (priority, sent_at, landed_at), the first landing of each."""
        with self._lock:
            return dict(self._records)

    def count(self) -> int:
        with self._lock:
            return len(self._records)


def depth(hub: EdgeHub, priority: int) -> int:
    """References in ``$upstream``'s queue of ``priority``: undelivered ones, and expired ones cleanup has not
    removed yet (every 2 s here); a delivered one leaves with its checkpoint. A scan: a few hundred rows."""
    q = QueueId("$upstream", priority)
    return hub.store.count(q) if q in hub.store.queues("$upstream") else 0


async def drive(sc: Scenario, hub: EdgeHub, link: LinkSim, devices: list[Device], samples: Samples) -> float:
    """Publish through warm, outage and after, sampling; returns the outage's start (seconds from t0)."""
    rnd = random.Random(sc.seed)
    t0 = time.monotonic()
    stop = asyncio.Event()

    async def publish() -> None:
        n = 0
        while not stop.is_set():
            for d in devices:
                kind = "alert" if rnd.random() < ALERT_CHANCE else "telemetry"
                d.publish(kind, reading(d.name, n, rnd))
            n += 1
            await asyncio.sleep(max(0.0, t0 + n - time.monotonic()))  # one tick a second, without drift

    async def sample() -> None:
        while True:
            samples.t.append(time.monotonic() - t0)
            for p in PRIORITIES:
                samples.depth[p].append(depth(hub, p))
            samples.up_bytes.append(link.stats.up_bytes)
            await asyncio.sleep(SAMPLE_S)

    sampler = asyncio.create_task(sample(), name="demo.sample")
    async with asyncio.TaskGroup() as tg:
        tg.create_task(publish(), name="demo.devices")
        await asyncio.sleep(sc.warm_s)
        outage_at = time.monotonic() - t0
        link.go_silent()
        print(f"demo: t={outage_at:.0f}s the link goes silent for {sc.outage_s:.0f}s", flush=True)
        await asyncio.sleep(sc.outage_s)
        link.restore()
        print(f"demo: t={time.monotonic() - t0:.0f}s the link is back", flush=True)
        await asyncio.sleep(sc.after_s)
        stop.set()
    print(f"demo: t={time.monotonic() - t0:.0f}s the devices stop; draining", flush=True)
    async with asyncio.timeout(sc.drain_timeout_s):  # polling: the queues' depth has no event to wait on
        while True:
            if not any(d.unacked() for d in devices) and not any(depth(hub, p) for p in PRIORITIES):
                break
            await asyncio.sleep(SAMPLE_S)
    await asyncio.sleep(2 * SAMPLE_S)  # two more samples of the drained queues, for the plot
    sampler.cancel()
    return outage_at


def prepare(sc: Scenario, out: Path) -> tuple[Path, Path, Path, list[str]]:
    """A clean ``out`` (what an earlier run left is removed), the manifest; the data, landing and manifest paths
    and the device names."""
    for name in ("data", "landing", "lake", "checkpoint", "cloud"):
        shutil.rmtree(out / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    data, landing, manifest_path = out / "data", out / "landing", out / "manifest.json"
    manifest(manifest_path, sc.telemetry_ttl_s)
    return data, landing, manifest_path, [f"sensor-{i:02d}" for i in range(1, sc.devices + 1)]


async def run(sc: Scenario, out: Path, *, spark: bool, plot_png: bool) -> dict[str, Any]:
    data, landing, manifest_path, names = await asyncio.to_thread(prepare, sc, out)
    store = open_store(data)
    identities = open_identities(store, DEFAULT_HOST_NAME, data_dir=data)
    for name in names:
        await identities.set_password(Identity.parse(name), b"pw")
    await store.close()
    samples = Samples()
    landed = Landed(landing)
    async with MosquittoPeer(out, name="cloud", way=PeerWay.BINARY) as cloud:
        link = LinkSim(target_host=cloud.host, target_port=cloud.port, rate_bps=sc.rate_bps, delay_s=DELAY_S)
        receiver = Receiver(
            ReceiverSettings(broker=f"mqtt://{cloud.host}:{cloud.port}", landing=str(landing)), on_landed=landed
        )
        await asyncio.to_thread(receiver.start)
        async with link:
            upstream = MqttUpstreamSettings(
                host="127.0.0.1",
                port=link.port,
                client_id="demo-hub",
                hub_id="demo",
                link_rate_bps=sc.rate_bps,
                link_rtt_s=2 * DELAY_S,
                keepalive_s=10,
            )
            # Cleanup every 2 s (default 60): expired telemetry leaves the queue soon after its TTL, so the plot
            # shows the depth levelling off at rate x TTL during the outage.
            config = HubConfig(
                manifest=manifest_path,
                data_dir=data,
                mqtt_port=0,
                mqtts_port=None,
                upstream=upstream,
                cleanup_interval_s=2.0,
            )
            stop = asyncio.Event()
            ports: asyncio.Queue[dict[str, int]] = asyncio.Queue()
            hubs: list[EdgeHub] = []
            serving = asyncio.create_task(
                serve(config, stop=stop, on_ready=ports.put_nowait, on_hub=hubs.append), name="demo.hub"
            )
            async with asyncio.timeout(60):
                port = (await ports.get())["tcp"]
            devices = [Device(name, port) for name in names]
            try:
                for d in devices:
                    await d.start()
                print(f"demo: {len(devices)} devices publishing; link {sc.rate_bps / 1000:g} kbit/s", flush=True)
                outage_at = await drive(sc, hubs[0], link, devices, samples)
                expired_total = hubs[0].store.removed[RemovalReason.TTL]
                delivered_by_hub = hubs[0].upstream_status().transport
                hub_acked = delivered_by_hub.messages_acked if delivered_by_hub is not None else 0
                async with asyncio.timeout(30):  # the last segments' way from the broker to the landing zone
                    while True:
                        if landed.count() >= hub_acked:
                            break
                        await asyncio.sleep(0.2)
            finally:
                for d in devices:
                    await d.stop()
                stop.set()
                async with asyncio.timeout(60):
                    await serving
        await asyncio.to_thread(receiver.stop)
    records = landed.records()
    lake = await asyncio.to_thread(lake_rows_per_priority, landing, out) if spark else None
    figures = {
        p: PriorityFigures.of(
            priority=p,
            sent=sum(d.sent[p] for d in devices),
            lake_rows=None if lake is None else lake.get(p, 0),
            landed=[(sent_at, landed_at) for (prio, sent_at, landed_at) in records.values() if prio == p],
        )
        for p in PRIORITIES
    }
    for line in table(figures, expired_total=expired_total):
        print(line)
    summary: dict[str, Any] = {
        "duration_s": round(samples.t[-1], 1) if samples.t else 0,
        "outage_at_s": round(outage_at, 1),
        "outage_s": sc.outage_s,
        "rate_bps": sc.rate_bps,
        "expired_ttl_hub": expired_total,
        **{f"p{p}": f.as_dict() for p, f in figures.items()},
    }
    if plot_png:
        png = out / "demo.png"
        await asyncio.to_thread(plot, png, samples, outage_at=outage_at, outage_s=sc.outage_s, rate_bps=sc.rate_bps)
        print(f"demo: wrote {png}")
        summary["png"] = str(png)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("demo-out"))
    p.add_argument("--devices", type=int, default=10)
    p.add_argument("--warm-s", type=float, default=20.0)
    p.add_argument("--outage-s", type=float, default=60.0)
    p.add_argument("--after-s", type=float, default=30.0)
    p.add_argument("--rate", default="64kbit")
    p.add_argument("--telemetry-ttl-s", type=int, default=45)
    p.add_argument("--no-spark", action="store_true", help="skip the Spark job (the lake column stays empty)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    ns = p.parse_args(argv)
    if not 1 <= ns.devices <= 200:
        p.error("--devices must be 1 to 200")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sc = Scenario(
        devices=ns.devices,
        warm_s=ns.warm_s,
        outage_s=ns.outage_s,
        after_s=ns.after_s,
        rate_bps=parse_rate_bps(ns.rate),
        telemetry_ttl_s=ns.telemetry_ttl_s,
    )
    summary = asyncio.run(run(sc, ns.out, spark=not ns.no_spark, plot_png=not ns.no_plot))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
