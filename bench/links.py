"""python -m bench.links: a hub with a cheap and a metered uplink through a hard cut and a silent outage of the cheap
one, versus a Mosquitto bridge given both addresses, in one run; lost and duplicated messages counted in the lake.

Usage::

    python -m bench.links                          # the issue's scenario: outages of 60 s each; about 5 min
    python -m bench.links --cut-s 10 --silent-s 10 --after-s 15     # shorter outages (a scaled run says so)
    python -m bench.links --lake records           # count in the landed records, not through the Spark job

Each side has its own cloud Mosquitto and its own two ``LinkSim`` links to it: **cheap** (256 kbit/s, 40 ms one
way: 80 ms RTT) and **metered** (32 kbit/s, 350 ms one way: 700 ms RTT). Three paho devices publish QoS 1 into
the edge: ``alarm`` one alarm every ``--alarm-every-s`` (priority 0), ``event`` one event every
``--event-every-s`` (priority 1), ``pump`` ``--telemetry-per-s`` 200-byte readings a second (priority 5); each
message numbered per device (application property ``seq``). The scenario: ``--warm-s`` with both links up; the
cheap link **cut** hard (every connection reset, new ones refused) for ``--cut-s``; ``--after-s`` up; the cheap
link **silent** (nothing forwarded, no FIN, no RST) for ``--silent-s``; ``--after-s`` up; then the devices stop
and the run waits (at most ``--drain-max-s``) until everything arrived.

* **edgehub**: the real hub (``serve(HubConfig)``), its manifest's ``upstream.links``: ``cell`` over the cheap link
  (cost 0, keepalive 1 s), ``sat`` over the metered one (cost 8 per MiB, priorities 0-1, a daily budget of
  ``--budget-bytes`` with priority 0 allowed past it, settle 10 s); batch mode, zstd with the dictionary the lane
  trains and each link sends once (``--compression gzip``: gzip). In the cloud, ``spark_upload.receiver`` lands
  the segments and, after the run, ``spark_upload.job`` (``--trigger available-now``) builds the lake, whose
  bronze rows (``bench.chaos.lake``) are counted: **lost** = published and PUBACKed by the hub but not in the
  lake; **duplicates** = lake rows beyond the first for one ``(device, seq)``. ``--lake records`` counts the
  landed records instead, deduplicated by ``edge_message_id`` as the job does (no JVM; what the smoke test uses).
* **bridge**: Debian's mosquitto as the edge broker, bridged (QoS 1, persistent session) to the cloud with
  ``address cheap metered`` and ``round_robin false`` (back to the first address when it can), keepalive 1 s:
  all traffic alike, one message per PUBLISH.

Figures: ``p0_p99_s`` (and p50, max): from an alarm's PUBLISH at the edge to its arrival in the cloud, every alarm,
through both outages; ``failover_cut_s`` / ``failover_silent_s``: from the cut (or the silence) to the first byte of
a PUBLISH into the metered link (its first upward chunk of more than a PINGREQ's 2 bytes), sampled every 5 ms;
``failover_*_delivered_s``: the same byte at the link's far end (its 350 ms one way later); ``expensive_bytes``:
every byte the metered link carried up over the run (CONNECTs and pings included), and the bridge's;
``expensive_bytes_ratio`` = ours / the bridge's. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import logging
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.rig import Processes
from bench.uplink import Device, telemetry
from edgehub.core import Identity
from edgehub.runtime.compose.config import DEFAULT_HOST_NAME, HubConfig
from edgehub.runtime.compose.serve import serve
from edgehub.runtime.compose.store import open_identities, open_store
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer, PeerWay
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.segment import decode_segment, dictionary_id

CHEAP = {"rate_bps": 256_000.0, "delay_s": 0.040}
METERED = {"rate_bps": 32_000.0, "delay_s": 0.350}
DEVICES = ("alarm", "event", "pump")
PRIORITY = {"alarm": 0, "event": 1, "pump": 5}
SAMPLE_S = 0.005


@dataclass(frozen=True)
class Scenario:
    warm_s: float
    cut_s: float
    silent_s: float
    after_s: float
    alarm_every_s: float
    event_every_s: float
    telemetry_per_s: float
    budget_bytes: int
    drain_max_s: float
    lake: str  # "spark" or "records"
    compression: str  # the segments' codec, gzip or zstd (with the lane's trained dictionary, which both links use)
    settle_s: float  # the cheap link's settle time


@dataclass
class Run:
    """What one side saw, on ``time.monotonic()``."""

    sent_at: dict[tuple[str, int], float] = field(default_factory=dict)  # (device, seq) -> published
    arrived: dict[tuple[str, int], float] = field(default_factory=dict)  # first arrival in the cloud
    arrivals: int = 0
    cut_at: float = 0.0
    silent_at: float = 0.0
    first_publish_after: dict[str, float | None] = field(default_factory=dict)
    expensive_bytes: int = 0
    cheap_bytes: int = 0
    lost: int | None = None
    duplicates: int | None = None
    lake_rows: int | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set when arrivals were taken

    def figures(self, prefix: str = "") -> dict[str, Any]:
        alarms = sorted(self.arrived.get(k, time.monotonic()) - t for k, t in self.sent_at.items() if k[0] == "alarm")

        def pct(q: float) -> float | None:
            return round(alarms[min(len(alarms) - 1, round(q * (len(alarms) - 1)))], 3) if alarms else None

        def after(kind: str, at: float) -> float | None:
            t = self.first_publish_after.get(kind)
            return round(t - at, 3) if t is not None else None

        return {
            f"{prefix}p0_p50_s": pct(0.5),
            f"{prefix}p0_p99_s": pct(0.99),
            f"{prefix}p0_max_s": pct(1.0),
            f"{prefix}p0_count": len(alarms),
            f"{prefix}failover_cut_s": after("cut", self.cut_at),
            f"{prefix}failover_silent_s": after("silent", self.silent_at),
            f"{prefix}failover_cut_delivered_s": after("delivered_cut", self.cut_at),
            f"{prefix}failover_silent_delivered_s": after("delivered_silent", self.silent_at),
            f"{prefix}expensive_bytes": self.expensive_bytes,
            f"{prefix}cheap_bytes": self.cheap_bytes,
            f"{prefix}published": len(self.sent_at),
            f"{prefix}arrived": len(self.arrived),
            f"{prefix}arrivals": self.arrivals,
        }


class Devices:
    """The three devices, numbering each message (``seq``) and keeping when it was sent."""

    def __init__(self, port: int, run: Run, topic: Callable[[str, int], str], *, password: str | None) -> None:
        self.run = run
        self.topic = topic
        self.devices = {name: Device(name, port, password=password) for name in DEVICES}
        self.seq = dict.fromkeys(DEVICES, 0)

    async def start(self) -> None:
        for d in self.devices.values():
            await d.start()

    def publish(self, name: str, body: bytes) -> None:
        self.seq[name] += 1
        seq = self.seq[name]
        self.run.sent_at[(name, seq)] = time.monotonic()
        self.devices[name].publish(self.topic(name, seq), body)

    async def wait_acked(self) -> None:
        for name, d in self.devices.items():
            await d.wait_acked(self.seq[name])

    async def stop(self) -> None:
        for d in self.devices.values():
            await d.stop()


async def drive(sc: Scenario, cheap: LinkSim, metered: LinkSim, devices: Devices, say: Callable[[str], None]) -> None:
    """Traffic all along; the cut, the silence and their ends; the metered link watched for its first PUBLISH."""
    run = devices.run
    stop = asyncio.Event()
    watching: dict[str, float] = {}  # kind ("cut", "silent") -> since

    async def every(period_s: float, send: Callable[[int], None]) -> None:
        n = 0
        start = time.monotonic()
        while not stop.is_set():
            send(n)
            n += 1
            delay = start + n * period_s - time.monotonic()
            if delay > 0:
                try:
                    async with asyncio.timeout(delay):
                        await stop.wait()
                except TimeoutError:
                    pass

    async def watch() -> None:
        # Two clocks per event: when the hub's first PUBLISH entered the metered link (the hand-over, the
        # figure), and when it reached the far end (the link's own 350 ms one way added).
        last = {"": metered.stats.up_sent_bytes, "delivered_": metered.stats.up_bytes}
        pending: dict[str, set[str]] = {}
        while not stop.is_set():
            stats = metered.stats
            for way, now_bytes in (("", stats.up_sent_bytes), ("delivered_", stats.up_bytes)):
                if now_bytes - last[way] > 2:  # more than a PINGREQ: a PUBLISH (or a CONNECT) went up
                    for kind, since in list(watching.items()):
                        seen = pending.setdefault(kind, set())
                        if way in seen:
                            continue
                        seen.add(way)
                        run.first_publish_after[way + kind] = time.monotonic()
                        say(
                            f"{kind}: first bytes {'at the far end of' if way else 'into'} the metered link "
                            f"{time.monotonic() - since:.3f} s after"
                        )
                        if len(seen) == 2:
                            del watching[kind]
                last[way] = now_bytes
            await asyncio.sleep(SAMPLE_S)

    async def outage(kind: str, begin: Callable[[], None], seconds: float) -> float:
        """The cheap link down (``begin``) for ``seconds``, then up for ``after_s``; when it went down."""
        at = watching[kind] = time.monotonic()
        begin()
        say(f"cheap link {kind}")
        await asyncio.sleep(seconds)
        cheap.restore()
        say("cheap link back")
        await asyncio.sleep(sc.after_s)
        return at

    rnd = random.Random(1)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(every(sc.alarm_every_s, lambda n: devices.publish("alarm", b'{"alarm":"pressure"}')))
        tg.create_task(every(sc.event_every_s, lambda n: devices.publish("event", b'{"event":"valve-open"}')))
        tg.create_task(every(1 / sc.telemetry_per_s, lambda n: devices.publish("pump", telemetry(n, rnd))))
        tg.create_task(watch())
        await asyncio.sleep(sc.warm_s)
        run.cut_at = await outage("cut", cheap.cut, sc.cut_s)
        run.silent_at = await outage("silent", cheap.go_silent, sc.silent_s)
        stop.set()
    async with asyncio.timeout(60):
        await devices.wait_acked()


async def wait_arrived(run: Run, max_s: float) -> None:
    """Until every message sent arrived in the cloud, at most ``max_s``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max_s):
            while len(run.arrived) < len(run.sent_at):
                run.changed.clear()
                await run.changed.wait()


async def drive_collecting(
    sc: Scenario,
    cheap: LinkSim,
    metered: LinkSim,
    devices: Devices,
    say: Callable[[str], None],
    run: Run,
    take_arrivals: Callable[[], None],
) -> None:
    """Drive the scenario while taking the sink's arrivals every 0.1 s, then wait for the rest (``drain_max_s`` at
    most); either way take the last arrivals and stop the devices. Each contender says how it reads its sink."""

    async def collect() -> None:
        while True:
            take_arrivals()
            await asyncio.sleep(0.1)

    collector = asyncio.create_task(collect())
    try:
        await drive(sc, cheap, metered, devices, say)
        await wait_arrived(run, sc.drain_max_s)
    finally:
        collector.cancel()
        take_arrivals()
        await devices.stop()


def manifest(path: Path, sc: Scenario, cheap: LinkSim, metered: LinkSim) -> None:
    routes = {
        name: {
            "route": f"FROM /messages/* WHERE $connectionDeviceId = '{name}' INTO $upstream",
            "priority": PRIORITY[name],
            "timeToLiveSecs": 86400,
        }
        for name in DEVICES
    }
    links = [
        {
            "name": "cell",
            "address": f"127.0.0.1:{cheap.port}",
            "costPerMiB": 0,
            "keepaliveSecs": 1,
            "ackTimeoutSecs": 3,
            "linkRateBps": int(CHEAP["rate_bps"]),
            "linkRttMs": round(2000 * CHEAP["delay_s"]),
        },
        {
            "name": "sat",
            "address": f"127.0.0.1:{metered.port}",
            "costPerMiB": 8,
            "priorities": "0-1",
            "budget": {"bytes": sc.budget_bytes, "period": "day"},
            "allowedOverBudget": "0",
            "keepaliveSecs": 30,
            "linkRateBps": int(METERED["rate_bps"]),
            "linkRttMs": round(2000 * METERED["delay_s"]),
        },
    ]
    links[0]["settleSecs"] = sc.settle_s
    doc = {"schemaVersion": "1.1", "routes": routes, "upstream": {"links": links, "compression": sc.compression}}
    path.write_text(json.dumps(doc, indent=1))


def links(cloud: MosquittoPeer) -> tuple[LinkSim, LinkSim]:
    return (
        LinkSim(target_host=cloud.host, target_port=cloud.port, **CHEAP),  # type: ignore[arg-type]
        LinkSim(target_host=cloud.host, target_port=cloud.port, **METERED),  # type: ignore[arg-type]
    )


async def run_edgehub(sc: Scenario, work: Path) -> Run:
    def say(text: str) -> None:
        print(f"edgehub: {text}", flush=True)

    run = Run()
    data, landing, lake, logs = (work / n for n in ("data", "landing", "lake", "logs"))
    for folder in (landing, logs):
        folder.mkdir(parents=True)
    store = open_store(data)
    identities = open_identities(store, DEFAULT_HOST_NAME, data_dir=data)
    for name in DEVICES:
        await identities.set_password(Identity.parse(name), b"pw")
    await store.close()
    procs = Processes(logs)
    try:
        async with MosquittoPeer(work, name="cloud", way=PeerWay.BINARY) as cloud:
            cheap, metered = links(cloud)
            async with cheap, metered, MqttCollector(host=cloud.host, port=cloud.port, topic="edgehub/#") as sink:
                receiver, _, _ = await procs.spawn(
                    "receiver",
                    sys.executable,
                    *("-m", "spark_upload.receiver", "--broker", f"mqtt://{cloud.host}:{cloud.port}"),
                    *("--landing", str(landing), "--client-id", "bench-landing"),
                    ready=re.compile(r"receiver\.subscribed"),
                )
                manifest(work / "manifest.json", sc, cheap, metered)
                upstream = MqttUpstreamSettings(host="unused", client_id="edge-hub", hub_id="edge")
                config = HubConfig(
                    manifest=work / "manifest.json", data_dir=data, mqtt_port=0, mqtts_port=None, upstream=upstream
                )
                stop = asyncio.Event()
                ports: asyncio.Queue[dict[str, int]] = asyncio.Queue()
                hub = asyncio.create_task(serve(config, stop=stop, on_ready=ports.put_nowait), name="bench.hub")
                async with asyncio.timeout(30):
                    port = (await ports.get())["tcp"]
                devices = Devices(
                    port, run, lambda name, seq: f"devices/{name}/messages/events/seq={seq}", password="pw"
                )
                await devices.start()
                counted = 0
                dictionaries: dict[int, bytes] = {}

                def take_arrivals() -> None:
                    nonlocal counted
                    for m in sink.messages[counted:]:
                        if (dict_id := dictionary_id(m.payload)) is not None:  # a link's zstd dictionary
                            dictionaries[dict_id] = m.payload
                            continue
                        for r in decode_segment(m.payload, dictionaries):
                            key = (r.device_id or "", int(r.properties.get("seq") or 0))
                            run.arrivals += 1
                            run.arrived.setdefault(key, m.received_at)
                    counted = len(sink.messages)
                    run.changed.set()

                try:
                    await drive_collecting(sc, cheap, metered, devices, say, run, take_arrivals)
                finally:
                    stop.set()
                    async with asyncio.timeout(30):
                        await hub
                run.expensive_bytes, run.cheap_bytes = metered.stats.up_bytes, cheap.stats.up_bytes
                await landed_all(run, landing, sc.drain_max_s)  # the receiver lands what the broker holds for it
                procs.kill(receiver, signal.SIGINT)
                with contextlib.suppress(TimeoutError):  # killed outright past it: what it landed is on disk
                    await procs.wait(receiver, 15)
                if sc.lake == "records":
                    rows = landed_rows(landing)
                else:
                    rows = await spark_rows(procs, work, landing, lake)
                count_lake(run, rows)
                say(f"lake: {run.lake_rows} rows, lost {run.lost}, duplicates {run.duplicates}")
    finally:
        await procs.kill_all()
    return run


async def landed_all(run: Run, landing: Path, max_s: float) -> None:
    """Until the landing zone holds every message sent, at most ``max_s`` (read once a second)."""
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        rows = set(await asyncio.to_thread(landed_rows, landing))
        if all(key in rows for key in run.sent_at):
            return
        await asyncio.sleep(1.0)


def landed_rows(landing: Path) -> list[tuple[str, int]]:
    """The landing zone's records, deduplicated by ``(hub_id, edge_message_id)`` as the Spark job does."""
    seen: set[tuple[str, str]] = set()
    rows = []
    for f in sorted(landing.rglob("*.jsonl.gz")):
        if "rejected" in f.parts or "quarantine" in f.parts or f.name.startswith("."):
            continue
        for line in gzip.decompress(f.read_bytes()).splitlines():
            rec = json.loads(line)
            key = (rec["hub_id"], rec["edge_message_id"])
            if key in seen:
                continue
            seen.add(key)
            sysprops = rec.get("system_properties") or {}
            device = rec.get("device_id") or sysprops.get("connectionDeviceId") or ""
            rows.append((device, int((rec.get("properties") or {}).get("seq") or 0)))
    return rows


async def spark_rows(procs: Processes, work: Path, landing: Path, lake: Path) -> list[tuple[str, int]]:
    job, _, job_log = await procs.spawn(
        "spark-job",
        sys.executable,
        *("-m", "spark_upload.job", "--landing", str(landing), "--lake", str(lake)),
        *("--checkpoint", str(work / "checkpoint"), "--trigger", "available-now", "--master", "local[2]"),
    )
    if await procs.wait(job, 600) != 0:
        raise RuntimeError(f"the Spark job failed; see {job_log}")
    out = work / "bronze.jsonl"
    reader, _, reader_log = await procs.spawn(
        "lake", sys.executable, "-m", "bench.chaos.lake", "--lake", str(lake), "--out", str(out)
    )
    if await procs.wait(reader, 300) != 0:
        raise RuntimeError(f"reading the lake failed; see {reader_log}")
    rows = []
    for line in out.read_text().splitlines():
        r = json.loads(line)
        rows.append((r["device"] or "", int(r["seq"] or 0)))
    return rows


def count_lake(run: Run, rows: list[tuple[str, int]]) -> None:
    counts: dict[tuple[str, int], int] = {}
    for key in rows:
        counts[key] = counts.get(key, 0) + 1
    run.lake_rows = len(rows)
    run.duplicates = sum(n - 1 for n in counts.values())
    run.lost = sum(1 for key in run.sent_at if key not in counts)


async def run_bridge(sc: Scenario, work: Path) -> Run:
    def say(text: str) -> None:
        print(f"bridge: {text}", flush=True)

    run = Run()
    await asyncio.to_thread(work.mkdir, parents=True)
    async with MosquittoPeer(work, name="cloud", way=PeerWay.BINARY) as cloud:
        cheap, metered = links(cloud)
        async with cheap, metered, MqttCollector(host=cloud.host, port=cloud.port, topic="#", client_id="sink") as sink:
            bridge = [
                "max_queued_messages 10000000",
                "max_inflight_messages 20",
                "connection cloud",
                f"address 127.0.0.1:{cheap.port} 127.0.0.1:{metered.port}",
                "round_robin false",
                "topic edge/# out 1",
                "bridge_protocol_version mqttv311",
                "cleansession false",
                "keepalive_interval 1",
                "restart_timeout 1 2",
            ]
            async with MosquittoPeer(work, name="edge", way=PeerWay.BINARY, extra_config=bridge) as edge:
                devices = Devices(edge.port, run, lambda name, seq: f"edge/{name}/{seq}", password=None)
                await devices.start()

                def take_arrivals() -> None:
                    for m in sink.messages[run.arrivals :]:
                        _, name, seq = m.topic.split("/")
                        run.arrived.setdefault((name, int(seq)), m.received_at)
                    run.arrivals = len(sink.messages)
                    run.changed.set()

                await drive_collecting(sc, cheap, metered, devices, say, run, take_arrivals)
            run.expensive_bytes, run.cheap_bytes = metered.stats.up_bytes, cheap.stats.up_bytes
    return run


async def both(sc: Scenario, work: Path, only: str | None) -> dict[str, Run]:
    jobs = {}
    if only in (None, "edgehub"):
        jobs["edgehub"] = run_edgehub(sc, work / "edgehub")
    if only in (None, "bridge"):
        jobs["bridge"] = run_bridge(sc, work / "bridge")
    results = await asyncio.gather(*jobs.values())
    return dict(zip(jobs, results, strict=True))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--warm-s", type=float, default=20.0)
    ap.add_argument("--cut-s", type=float, default=60.0, help="the hard cut of the cheap link")
    ap.add_argument("--silent-s", type=float, default=60.0, help="the silent outage of the cheap link")
    ap.add_argument("--after-s", type=float, default=30.0, help="up after each outage")
    ap.add_argument("--alarm-every-s", type=float, default=1.0)
    ap.add_argument("--event-every-s", type=float, default=2.0)
    ap.add_argument("--telemetry-per-s", type=float, default=20.0)
    ap.add_argument("--budget-bytes", type=int, default=10_000_000, help="the metered link's daily budget")
    ap.add_argument("--drain-max-s", type=float, default=90.0)
    ap.add_argument("--lake", choices=["spark", "records"], default="spark")
    ap.add_argument("--compression", choices=["gzip", "zstd"], default="zstd", help="edgehub: the segment codec")
    ap.add_argument("--settle-s", type=float, default=10.0, help="edgehub: the cheap link's settle time")
    ap.add_argument("--only", choices=["edgehub", "bridge"], default=None)
    args = ap.parse_args(argv)
    sc = Scenario(
        warm_s=args.warm_s,
        cut_s=args.cut_s,
        silent_s=args.silent_s,
        after_s=args.after_s,
        alarm_every_s=args.alarm_every_s,
        event_every_s=args.event_every_s,
        telemetry_per_s=args.telemetry_per_s,
        budget_bytes=args.budget_bytes,
        drain_max_s=args.drain_max_s,
        lake=args.lake,
        compression=args.compression,
        settle_s=args.settle_s,
    )
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    print(
        f"scenario: cheap 256 kbit/s 80 ms RTT, metered 32 kbit/s 700 ms RTT; P0 every {sc.alarm_every_s} s, P1 every "
        f"{sc.event_every_s} s, P5 {sc.telemetry_per_s:g}/s x 200 B; warm {sc.warm_s} s, cut {sc.cut_s} s, up "
        f"{sc.after_s} s, silent {sc.silent_s} s, up {sc.after_s} s; lake {sc.lake}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-links-") as tmp:
        res = asyncio.run(both(sc, Path(tmp), args.only))
    e, b = res.get("edgehub"), res.get("bridge")
    out: dict[str, Any] = {}
    if e is not None:
        out |= e.figures() | {"lost": e.lost, "duplicates": e.duplicates, "lake_rows": e.lake_rows}
    if b is not None:
        out |= b.figures("bridge_")
    if e is not None and b is not None:
        out["expensive_bytes_ratio"] = round(e.expensive_bytes / b.expensive_bytes, 4) if b.expensive_bytes else None
    out |= {
        "lake": sc.lake,
        "load_avg": round(os.getloadavg()[0], 2),
        "scaled": sc.cut_s < 60 or sc.silent_s < 60,
    }
    for k, v in out.items():
        print(f"  {k} = {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
