"""The chaos run itself: set up, drive the schedule, drain, run the Spark job, read the lake, verify, report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.clients import AmqpDevice, CommandDevice, ModuleConsumer, MqttDevice, Publisher
from bench.chaos.cloud import Cloud
from bench.chaos.rig import Hub, Processes
from bench.chaos.schedule import Event, EventKind, make_schedule
from bench.chaos.verify import Acked, LakeRow, Route, Verdict, verify
from bench.chaos.verify_cloud import CloudVerdict, verify_cloud
from edgehub.core import Identity
from edgehub.runtime.compose.config import DEFAULT_HOST_NAME
from edgehub.runtime.compose.store import open_identities, open_store
from edgehub.testing.linksim import LinkSim
from edgehub.testing.peers import MosquittoPeer, PeerWay
from edgehub.upstream.segment import decode_segment

log = logging.getLogger("bench.chaos")

SHORT_TTL_S = 10.0
# Message classes: (share of a device's messages, route). "lo" also goes to the module's input.
CLASSES: dict[str, tuple[float, Route]] = {
    "hi": (0.2, Route(priority=0, lake=True, module=False)),
    "short": (0.2, Route(priority=2, lake=True, module=False, ttl_s=SHORT_TTL_S)),
    "lo": (0.6, Route(priority=5, lake=True, module=True)),
}
MQTT_DEVICES = ("dev-0", "dev-1", "dev-2", "dev-3")
AMQP_DEVICES = ("amqp-0", "amqp-1")
DEVICES = (*MQTT_DEVICES, *AMQP_DEVICES)
MODULE = "edge/consumer"
COMMAND_DEVICE = "cmd-0"  # receives the cloud's cloud-to-device messages and answers its method calls
# The hub's peak RSS over the run must stay under this (the memory bound); a hub on a Pi Zero has far less.
RSS_LIMIT_MIB = 200.0
PASSWORD = "chaos-pw"
RATE_HZ = 10.0  # per device
# Each device publishes BURST messages at once every BURST / RATE_HZ seconds, all on one grid of
# time.monotonic(), and each kill is aimed a few milliseconds after a burst: a SIGKILL at a random moment
# almost never lands between a durable write and its PUBACK (that is well under a millisecond per message), and
# that moment is what makes devices re-send, the hub's duplicate detection drop and lanes risk their order.
BURST = 5
LINK_DELAY_S = 0.05  # one way
DRAIN_RATE_BPS = 1_000_000.0
MANIFEST = {
    "schemaVersion": "1.1",
    "routes": {
        "alerts": {"route": "FROM /messages/* WHERE cls = 'hi' INTO $upstream", "priority": 0, "timeToLiveSecs": 86400},
        "perishable": {
            "route": "FROM /messages/* WHERE cls = 'short' INTO $upstream",
            "priority": 2,
            "timeToLiveSecs": int(SHORT_TTL_S),
        },
        "telemetry": {
            "route": "FROM /messages/* WHERE cls = 'lo' INTO $upstream",
            "priority": 5,
            "timeToLiveSecs": 86400,
        },
        "toModule": {
            "route": "FROM /messages/* WHERE cls = 'lo' INTO BrokeredEndpoint('/modules/consumer/inputs/in1')",
            "priority": 5,
            "timeToLiveSecs": 86400,
        },
    },
}


@dataclass
class Outcome:
    verdict: Verdict
    cloud: CloudVerdict
    rss_peak_mib: float
    rss_processes: int
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    resent: int = 0  # messages devices sent again for want of an ack: the kills landed mid-write
    amqp: int = 0  # of the acknowledged, those the AMQP devices sent


def say(text: str) -> None:
    print(text, flush=True)


class Landing:
    """What the receiver has landed so far: the ``(device, seq)`` of every record, and of each segment's lines in
    order; files read once each (they appear whole)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._read: set[Path] = set()
        self.keys: set[tuple[str, int]] = set()
        self.segments: list[list[tuple[str, int]]] = []

    def refresh(self) -> set[tuple[str, int]]:
        for path in sorted(self.root.rglob("*.jsonl.gz")) if self.root.exists() else []:
            if path in self._read:
                continue
            self._read.add(path)
            lines = [(r.device_id or "", int(r.properties.get("seq") or 0)) for r in decode_segment(path.read_bytes())]
            self.segments.append(lines)
            self.keys.update(lines)
        return self.keys


async def _add_identities(data: Path) -> None:
    store = open_store(data)
    try:
        identities = open_identities(store, DEFAULT_HOST_NAME, data_dir=data)
        for name in (*DEVICES, MODULE, COMMAND_DEVICE):
            await identities.set_password(Identity.parse(name), PASSWORD.encode())
    finally:
        await store.close()


def _apply(link: LinkSim, ev: Event) -> None:
    if ev.kind is EventKind.SILENT:
        link.go_silent()
    elif ev.kind is EventKind.CUT:
        link.cut()
    elif ev.kind is EventKind.RESTORE:
        link.restore()
    elif ev.kind is EventKind.RATE:
        link.set_rate(ev.value)


async def _drive(
    schedule: list[Event],
    duration_s: float,
    hub: Hub,
    link: LinkSim,
    timings: dict[str, float],
    disruptions: list[tuple[float, float]],
) -> None:
    """Play ``schedule``; each kill (to the restart's listening) and each outage (to its restore) is added to
    ``disruptions`` as epoch seconds."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    restarts: list[float] = []
    tick_s = BURST / RATE_HZ
    outage_since: float | None = None
    for ev in schedule:
        at = t0 + ev.at_s
        if ev.kind is EventKind.KILL:  # just after a burst (the devices' grid is time.monotonic(), as the loop's)
            at = math.ceil(at / tick_s) * tick_s + ev.offset_s
        wait = at - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        say(f"  t={loop.time() - t0:6.1f}s {ev.describe()}")
        if ev.kind is EventKind.KILL:
            killed_at = time.time()
            await hub.kill()
            await asyncio.sleep(ev.value)
            restarts.append(await hub.start())
            disruptions.append((killed_at, time.time()))
            say(f"  t={loop.time() - t0:6.1f}s hub back on port {hub.port} ({restarts[-1]:.1f} s to listen)")
        else:
            if ev.kind in (EventKind.SILENT, EventKind.CUT):
                outage_since = time.time()
            elif ev.kind is EventKind.RESTORE and outage_since is not None:
                disruptions.append((outage_since, time.time()))
                outage_since = None
            _apply(link, ev)
    wait = t0 + duration_s - loop.time()
    if wait > 0:
        await asyncio.sleep(wait)
    timings["restart_max_s"] = round(max(restarts, default=0.0), 2)


def _waiting_for(
    acked: list[Acked], landed: set[tuple[str, int]], module: dict[tuple[str, int], int], now: float
) -> int:
    """Acknowledged messages not yet at every destination whose TTL has not surely passed (acked + ttl)."""
    n = 0
    for a in acked:
        route = CLASSES[a.cls][1]
        key = (a.device, a.seq)
        away = (route.lake and key not in landed) or (route.module and key not in module)
        if away and (route.ttl_s is None or a.acked_at + route.ttl_s > now):
            n += 1
    return n


def _cloud_waiting_for(cloud: Cloud, command: CommandDevice, now: float) -> int:
    """Cloud-to-device messages the broker acknowledged that have not reached the device, and method calls with
    no answer whose timeout (plus the verifier's margin) has not passed."""
    received = command.c2d_received()
    c2d = sum(1 for n in cloud.c2d_acked() if n not in received)
    calls = sum(1 for c in cloud.calls() if not c.answers and c.sent_at + c.timeout_s + 15.0 > now)
    return c2d + calls


async def _drain(
    devices: Sequence[Publisher],
    module: ModuleConsumer,
    landing: Landing,
    cloud: Cloud,
    command: CommandDevice,
    drain_s: float,
) -> tuple[float, int]:
    """Wait (at most ``drain_s``) until the devices have their acks, every acknowledged message arrived or
    surely expired, every cloud-to-device message arrived and every method call was answered or is past its
    timeout; then 2 s more for what was on its way. The seconds it took, and what was still missing."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    deadline = t0 + drain_s
    missing = -1
    while loop.time() < deadline:  # polling threads and a folder: there is no event to wait on
        if any(d.pending() for d in devices):
            await asyncio.sleep(0.2)
            continue
        acked = [a for d in devices for a in d.acked()]
        missing = _waiting_for(acked, await asyncio.to_thread(landing.refresh), module.received(), time.time())
        missing += _cloud_waiting_for(cloud, command, time.time())
        if missing == 0:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(2.0)
    return loop.time() - t0, missing


def publishers(seed: int, hub: Hub) -> list[Publisher]:
    """The devices of a run: ``MQTT_DEVICES`` over MQTT, ``AMQP_DEVICES`` over AMQP, the same workload."""
    shares = [(name, share) for name, (share, _) in CLASSES.items()]
    devices: list[Publisher] = []
    for i, name in enumerate(DEVICES):
        kind, port_of = (AmqpDevice, hub.get_amqp_port) if name in AMQP_DEVICES else (MqttDevice, hub.get_port)
        devices.append(kind(name, PASSWORD, port_of, rate_hz=RATE_HZ, classes=shares, seed=seed * 100 + i, burst=BURST))
    return devices


def rss_mib(pid: int) -> float | None:
    """A process's resident set, from ``/proc`` (a read of procfs: it does not block on a disk); None once it is
    gone, or killed and not yet reaped (a zombie's status has no ``VmRSS``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = next((line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return int(kib) / 1024 if kib is not None else None


class LinkWatch:
    """When the hub's upstream had no connection through the link at all (polled every 0.25 s): a span of the
    run's disruptions like an outage, which it can outlast (a connection a silent outage left dead is given up
    on only at its keepalive, and a new one made after)."""

    def __init__(self, link: LinkSim, disruptions: list[tuple[float, float]]) -> None:
        self._link = link
        self._disruptions = disruptions
        self._since: float | None = None

    async def run(self) -> None:
        while True:
            if self._link.stats.connections == 0:
                if self._since is None:
                    self._since = time.time()
            elif self._since is not None:
                self._disruptions.append((self._since, time.time()))
                self._since = None
            await asyncio.sleep(0.25)

    def close(self) -> None:
        if self._since is not None:
            self._disruptions.append((self._since, time.time()))
            self._since = None


class RssWatch:
    """The hub's resident memory, read from ``/proc`` every second while it runs (each restart is a new process);
    ``peak_mib`` over the whole run, and per process in ``peaks``."""

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self.peaks: dict[int, float] = {}

    @property
    def peak_mib(self) -> float:
        return max(self.peaks.values(), default=0.0)

    async def run(self) -> None:
        while True:
            pid = self._hub.pid
            if pid is not None:
                mib = rss_mib(pid)
                if mib is not None:
                    self.peaks[pid] = max(self.peaks.get(pid, 0.0), mib)
            await asyncio.sleep(1.0)


async def run(seed: int, duration_s: float, work: Path, drain_s: float) -> Outcome:
    data, landing_dir, lake, checkpoint, logs = (work / n for n in ("data", "landing", "lake", "checkpoint", "logs"))
    for folder in (data, landing_dir, logs):
        folder.mkdir(parents=True)
    manifest = work / "manifest.json"
    manifest.write_text(json.dumps(MANIFEST, indent=1))
    await _add_identities(data)
    schedule = make_schedule(seed, duration_s)
    say(f"schedule (seed {seed}): " + ", ".join(f"{e.at_s:.0f}s {e.describe()}" for e in schedule if e.kind != "rate"))
    timings: dict[str, float] = {}
    notes: list[str] = []
    procs = Processes(logs)
    devices: list[Publisher] = []
    module: ModuleConsumer | None = None
    command: CommandDevice | None = None
    cloud_side: Cloud | None = None
    disruptions: list[tuple[float, float]] = []
    async with AsyncExitStack() as stack:
        stack.push_async_callback(procs.kill_all)
        cloud = await stack.enter_async_context(MosquittoPeer(work, name="cloud", way=PeerWay.BINARY))
        link = await stack.enter_async_context(
            LinkSim(target_host=cloud.host, target_port=cloud.port, rate_bps=256_000, delay_s=LINK_DELAY_S)
        )
        receiver, _, _ = await procs.spawn(
            "receiver",
            sys.executable,
            "-m",
            "spark_upload.receiver",
            "--broker",
            f"mqtt://{cloud.host}:{cloud.port}",
            "--landing",
            str(landing_dir),
            "--client-id",
            "chaos-landing",
            ready=re.compile(r"receiver\.subscribed"),
        )
        hub = Hub(procs, data=data, manifest=manifest, upstream_port=link.port)
        await hub.start()
        say(
            f"hub listening on {hub.port} (AMQP {hub.amqp_port}); cloud Mosquitto {cloud.port} behind the link "
            f"on {link.port}"
        )
        rss = RssWatch(hub)
        rss_task = asyncio.create_task(rss.run(), name="chaos.rss")
        stack.callback(rss_task.cancel)
        link_watch = LinkWatch(link, disruptions)
        link_task = asyncio.create_task(link_watch.run(), name="chaos.link")
        stack.callback(link_task.cancel)

        devices.extend(publishers(seed, hub))
        module = ModuleConsumer(MODULE, PASSWORD, hub.get_port)
        command = CommandDevice(COMMAND_DEVICE, PASSWORD, hub.get_port)
        cloud_side = Cloud(cloud.port, device=COMMAND_DEVICE, module=MODULE)

        def stop_clients() -> None:
            for d in devices:
                d.abort()
            listeners = [c for c in (module, command) if c is not None]
            for c in listeners:
                c.stop()
            if cloud_side is not None:
                cloud_side.stop()
            for d in devices:
                d.join(5)
            for c in listeners:
                c.join(5)

        stack.callback(stop_clients)
        module.start()
        command.start()
        cloud_side.start()
        for d in devices:
            d.start()
        say(
            f"chaos for {duration_s:.0f} s: {len(MQTT_DEVICES)} MQTT and {len(AMQP_DEVICES)} AMQP devices x "
            f"{RATE_HZ:g} msg/s, cloud-to-device messages and method calls, kills, outages, rates"
        )
        await _drive(schedule, duration_s, hub, link, timings, disruptions)

        link.restore()
        link.set_rate(DRAIN_RATE_BPS)
        for d in devices:
            d.stop_publishing()
        cloud_side.stop_sending()
        landing = Landing(landing_dir)
        took, missing = await _drain(devices, module, landing, cloud_side, command, drain_s)
        timings["drain_s"] = round(took, 1)
        if missing:
            notes.append(f"drain gave up after {took:.0f} s with {missing} messages not yet arrived")
        ended_at = time.time()
        link_watch.close()
        stop_clients()
        rc = await hub.stop()
        if rc != 0:
            notes.append(f"the hub's clean stop exited {rc}")
        procs.kill(receiver, signal.SIGINT)
        with contextlib.suppress(TimeoutError):
            await procs.wait(receiver, 15)
        await asyncio.to_thread(landing.refresh)

        t = time.monotonic()
        job, _, job_log = await procs.spawn(
            "spark-job",
            sys.executable,
            "-m",
            "spark_upload.job",
            "--landing",
            str(landing_dir),
            "--lake",
            str(lake),
            "--checkpoint",
            str(checkpoint),
            "--trigger",
            "available-now",
            "--master",
            "local[2]",
        )
        if await procs.wait(job, 300 + duration_s) != 0:  # a minute of chaos lands some 350 segment files
            raise RuntimeError(f"the Spark job failed; see {job_log}")
        timings["spark_job_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        rows_file = work / "bronze.jsonl"
        reader, _, reader_log = await procs.spawn(
            "lake", sys.executable, "-m", "bench.chaos.lake", "--lake", str(lake), "--out", str(rows_file)
        )
        if await procs.wait(reader, 300) != 0:
            raise RuntimeError(f"reading the lake failed; see {reader_log}")
        timings["lake_read_s"] = round(time.monotonic() - t, 1)

    rows = []
    for line in rows_file.read_text().splitlines():
        r = json.loads(line)
        if r["device"] in DEVICES and r["seq"] is not None:
            rows.append(LakeRow(r["device"], int(r["seq"]), int(r["priority"]), float(r["enqueued_at"])))
    verdict = verify(
        acked=[a for d in devices for a in d.acked()],
        routes={name: route for name, (_, route) in CLASSES.items()},
        lake=rows,
        module_received=module.received() if module is not None else {},
        ended_at=ended_at,
        segments=landing.segments,
        module_first_arrivals=module.first_arrivals() if module is not None else [],
        kills=hub.kills,  # each kill is followed by a start that must listen, or the run fails
    )
    assert module is not None
    assert command is not None
    assert cloud_side is not None
    cloud_verdict = verify_cloud(
        c2d_acked=cloud_side.c2d_acked(),
        c2d_received=command.c2d_received(),
        calls=cloud_side.calls(),
        answered={MODULE: module.answered, COMMAND_DEVICE: command.answered},
        connected={MODULE: module.connected.spans, COMMAND_DEVICE: command.connected.spans},
        disruptions=disruptions,
        stray_answers=cloud_side.stray_answers,
    )
    notes.append(
        f"device connections: {sum(d.connections for d in devices)}, re-sent for want of an ack: "
        f"{sum(d.resent for d in devices)}, refused by the hub: {sum(d.refused for d in devices)}; "
        f"module connections: {module.connections}; command device connections: {command.connections}"
    )
    rss_lives = sorted(rss.peaks.values())
    notes.append(
        f"hub RSS peak {rss.peak_mib:.1f} MiB over {len(rss_lives)} processes "
        f"(median process peak {rss_lives[len(rss_lives) // 2] if rss_lives else 0:.1f} MiB)"
    )
    amqp_acked = sum(len({a.seq for a in d.acked()}) for d in devices if d.name in AMQP_DEVICES)
    return Outcome(
        verdict,
        cloud_verdict,
        rss.peak_mib,
        len(rss.peaks),
        timings,
        notes,
        resent=sum(d.resent for d in devices),
        amqp=amqp_acked,
    )


async def _interruptible(run: Coroutine[Any, Any, Outcome]) -> Outcome:
    """``run``, cancelled on SIGTERM or SIGINT: its exit stack then stops every process it started."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    return await run


def report(o: Outcome) -> None:
    v = o.verdict
    say("")
    say("chaos soak: what the devices were told was stored, against what the lake and the module have")
    say(f"  acknowledged       {v.acknowledged:8d}  (distinct messages a device got a PUBACK or `accepted` for)")
    say(f"    over AMQP        {o.amqp:8d}")
    say(f"  delivered          {v.delivered:8d}  (in the lake's bronze table / at the module, as routed)")
    say(f"  expired            {v.expired:8d}  (short-TTL route, TTL could have passed before delivery)")
    say(f"  lost               {v.lost:8d}  (must be 0)")
    say(f"  duplicates         {v.duplicates:8d}  (extra lake rows for one device message; must be 0)")
    say(f"  order violations   {v.order_violations:8d}  (per device and priority, by enqueue time; must be 0)")
    say(f"    of which in segments {v.segment_order_violations:4d}  (line order of the landing zone's batches)")
    say(f"  kills survived     {v.kills:8d}  (SIGKILL, restart on the same data directory)")
    say(f"  module redeliveries {v.module_redeliveries:7d}  (QoS 1 at least once; not a failure)")
    say(f"  module order       {v.module_order_violations:8d}  (first arrivals out of a device's order)")
    say(f"  lake rows          {v.lake_rows:8d}  ({v.unacknowledged_in_lake} stored whose ack a kill took)")
    c = o.cloud
    say(f"  c2d acknowledged   {c.c2d_acknowledged:8d}  (cloud-to-device messages the broker acknowledged)")
    say(f"  c2d lost           {c.c2d_lost:8d}  (never at the device; must be 0)")
    say(f"  c2d redeliveries   {c.c2d_redeliveries:8d}  (at least once; not a failure)")
    say(f"  methods called     {c.methods_called:8d}  (half on the device, half on the module)")
    say(f"    answered 200     {c.methods_answered:8d}  (with the call's own payload)")
    say(f"    404 / 504        {c.methods_not_connected:4d} / {c.methods_timed_out:<4d} (target away / timed out)")
    say(f"    unanswered       {c.methods_unanswered:8d}  (lost with a kill or an outage)")
    say(f"    wrong            {c.methods_wrong:8d}  (wrong status, twice, or unexplained; must be 0)")
    say(f"  hub RSS peak       {o.rss_peak_mib:8.1f}  MiB (must stay under {RSS_LIMIT_MIB:g})")
    for text in [*v.lost_examples, *v.order_examples, *c.examples, *o.notes]:
        say(f"  - {text}")
    say("  timings: " + ", ".join(f"{k}={val}" for k, val in o.timings.items()))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description="The chaos soak of the whole hub.")
    ap.add_argument("--minutes", type=float, default=10.0, help="chaos phase length (default 10)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the schedule and the message classes")
    ap.add_argument("--drain-s", type=float, default=None, help="most to wait for the drain (default: by length)")
    ap.add_argument("--keep", type=Path, default=None, help="work here and keep it (data, landing, lake, logs)")
    args = ap.parse_args(argv)
    duration_s = args.minutes * 60
    if duration_s < 30:
        ap.error("--minutes must be at least 0.5")
    drain_s = args.drain_s if args.drain_s is not None else max(60.0, duration_s / 4)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # proton logs each connection a kill resets at ERROR ("Couldn't recv"): the AMQP devices expect those.
    logging.getLogger("proton").setLevel(logging.CRITICAL)
    say(f"bench.chaos: {args.minutes:g} min, seed {args.seed}, load average {os.getloadavg()[0]:.2f}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    t0 = time.monotonic()
    try:
        outcome = asyncio.run(_interruptible(run(args.seed, duration_s, work, drain_s)))
    except asyncio.CancelledError:
        say("bench.chaos: interrupted; every process it started was stopped")
        return 130
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    outcome.timings["total_s"] = round(time.monotonic() - t0, 1)
    report(outcome)
    memory = {
        "hub_rss_peak_mib": round(outcome.rss_peak_mib, 1),
        "hub_rss_limit_mib": RSS_LIMIT_MIB,
        "hub_rss_processes": outcome.rss_processes,  # hub processes sampled: each start, if it lived a second
    }
    extra = {"amqp_acknowledged": outcome.amqp, "resent": outcome.resent, "seed": args.seed, "minutes": args.minutes}
    print(json.dumps({**outcome.verdict.summary(), **outcome.cloud.summary(), **memory, **extra, **outcome.timings}))
    return 0
