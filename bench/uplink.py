"""python -m bench.uplink: the whole hub's upstream over a thin link, versus a Mosquitto bridge, in one run.

Usage::

    python -m bench.uplink                  # scaled default: 20,000 backlog, 60 s silent + 30 s hard outage; ~4 min
    python -m bench.uplink --backlog 50000 --drain-s 120 --outage-s 60 --after-s 240   # the issue's scenario
    python -m bench.uplink --only edgehub   # one side (for profiling); the JSON then lacks the other's figures

Both sides run at the same time, each through its own ``LinkSim`` (default 64 kbit/s each way, 300 ms one way)
in front of its own cloud Mosquitto, with the same scenario:

1. the link is silent; a device publishes ``--backlog`` priority-5 telemetry messages (200-byte JSON, QoS 1,
   paho) into the edge, and every PUBACK is in (the backlog is durable at the edge);
2. the link comes up; ``--drain-s`` seconds of draining; meanwhile, and until the end, a second device
   publishes one priority-0 alert every ``--alert-every-s`` seconds;
3. the link goes silent (no FIN, no RST) for ``--outage-s`` seconds, then comes back;
4. ``--after-s`` seconds more;
5. a hard cut: for ``--cut-s`` seconds every connection is reset and every new one refused (``LinkSim.cut``),
   then the link comes back; ``--after-cut-s`` seconds more (``--cut-s 0``: no hard cut); then 3 s for what is
   on its way.

* **edgehub**: the real hub, started as users start it (``serve(HubConfig)`` of ``edgehub.runtime``): the
  manifest routes device ``pump`` to ``$upstream`` at priority 5 and device ``alarm`` at priority 0; devices
  publish over MQTT into the hub's MQTT head; RocksDB store (fsync always), the endpoint executor, and the
  ``MqttUpstream`` transport in ``batch`` mode pointed at the link, zstd by default (``--compression``): the lane
  trains its dictionary from the backlog, sends it once, then compresses with it (``edgehub.upstream.dictionary``;
  the dictionary's bytes count in the wire bytes).
* **bridge**: Debian's mosquitto as the edge broker (the same paho devices publish into it), bridged with QoS 1
  and a persistent session to the cloud Mosquitto through the link: FIFO, one message per PUBLISH.

Figures (each side):

* ``p0`` latency: from the alert's PUBLISH at the edge to its arrival in the cloud, over the alerts raised while
  the link was up and stayed up for the next 3 s (an alert raised into an outage waits for the link, whatever
  the hub does; those are reported apart as ``p0_outage_max_s``). An alert not delivered by the end counts
  the time it waited so far (a lower bound).
* wire bytes per message: every byte the link carried up (CONNECTs, pings and resends included) over the
  distinct messages delivered.
* utilisation while draining: bytes carried up over ``rate x time`` while the link was up and backlog remained
  (from each restore to the earlier of the next outage and the last backlog message's arrival).
* resume: from the restore after the outage to the first byte of backlog entering the link, as the issue
  defines it: the arrival in the cloud of the first backlog message that had not arrived before, less one
  one-way delay and the serialisation of the PUBLISH that carried it (its wire bytes over the rate; the
  simulator has no jitter by default, so this is exact to the few bytes of MQTT 5 properties the estimate
  leaves out). ``resume_arrival_s`` is the arrival itself, the stricter figure. The outage outlasts
  1.5 x either side's keepalive, so the cloud broker has dropped the old connection and bytes held in the link
  during the outage cannot count. ``resume_cut_s`` (and ``resume_cut_arrival_s``) is the same figure for the
  restore after the hard cut (step 5), which leaves nothing held in the link.

Last line: one JSON object (``p0_p50_s``, ``p0_p99_s``, ``bridge_p0_p99_s``, ``wire_bytes_per_msg``,
``bridge_wire_bytes_per_msg``, ``utilisation``, ``resume_s``, ``resume_cut_s``, and more), with what each side
delivered: ``backlog_delivered`` of ``backlog`` and ``p0_missing`` (alerts not delivered by the end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from edgehub.core import Identity
from edgehub.runtime.compose.config import DEFAULT_HOST_NAME, HubConfig
from edgehub.runtime.compose.serve import serve
from edgehub.runtime.compose.store import open_identities, open_store
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer, PeerWay
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.wire import publish_wire_bytes
from edgehub.upstream.segment import Codec, decode_segment, dictionary_id

SETTLE_S = 3.0  # after the end, and the guard before an outage for counting an alert as "raised while up"


@dataclass(frozen=True)
class Scenario:
    backlog: int
    rate_bps: float
    delay_s: float
    alert_every_s: float
    drain_s: float
    outage_s: float
    after_s: float
    cut_s: float
    after_cut_s: float
    window_bytes: int | None
    batch_bytes: int | None
    linger_s: float | None
    keepalive_s: int
    compression: Codec


@dataclass
class Timeline:
    """What the scenario driver saw, on ``time.monotonic()``."""

    restores: list[float] = field(default_factory=list)
    outages: list[float] = field(default_factory=list)
    end: float = 0.0
    samples: list[tuple[float, int]] = field(default_factory=list)  # (t, link up bytes)
    alerts_at: dict[str, float] = field(default_factory=dict)

    def up_bytes_at(self, t: float) -> int:
        best = 0
        for at, n in self.samples:
            if at > t:
                break
            best = n
        return best

    def raised_while_up(self, at: float) -> bool:
        for down, up in zip(self.outages, self.restores[1:], strict=False):
            if down - SETTLE_S <= at < up:
                return False
        return at >= self.restores[0]


@dataclass
class Figures:
    p0_up_s: list[float] = field(default_factory=list)
    p0_outage_s: list[float] = field(default_factory=list)
    p0_missing: int = 0
    delivered: int = 0
    backlog_delivered: int = 0
    up_bytes: int = 0
    utilisation: float | None = None
    resume_s: float | None = None
    resume_arrival_s: float | None = None
    resume_cut_s: float | None = None
    resume_cut_arrival_s: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        def pct(values: list[float], q: float) -> float | None:
            v = sorted(values)
            return v[min(len(v) - 1, round(q * (len(v) - 1)))] if v else None

        return {
            "p0_p50_s": pct(self.p0_up_s, 0.5),
            "p0_p99_s": pct(self.p0_up_s, 0.99),
            "p0_count": len(self.p0_up_s),
            "p0_outage_max_s": max(self.p0_outage_s, default=None),
            "p0_missing": self.p0_missing,
            "delivered": self.delivered,
            "backlog_delivered": self.backlog_delivered,
            "wire_bytes_per_msg": self.up_bytes / self.delivered if self.delivered else None,
            "utilisation": self.utilisation,
            "resume_s": self.resume_s,
            "resume_arrival_s": self.resume_arrival_s,
            "resume_cut_s": self.resume_cut_s,
            "resume_cut_arrival_s": self.resume_cut_arrival_s,
            **self.notes,
        }


def telemetry(i: int, rnd: random.Random) -> bytes:
    body = {
        "deviceId": f"pump-{i % 17}",
        "seq": i,
        "ts": 1_790_000_000 + i // 10,
        "temperature": round(rnd.uniform(15, 35), 2),
        "pressure": round(rnd.uniform(0.9, 1.2), 4),
        "vibration": [round(rnd.uniform(0, 1), 3) for _ in range(4)],
        "status": rnd.choice(["ok", "ok", "ok", "warn"]),
    }
    raw = json.dumps(body, separators=(",", ":"))
    return (raw + " " * max(0, 200 - len(raw))).encode()  # 200-byte JSON


class Device:
    """A paho MQTT 3.1.1 client on its own thread; ``publish`` is QoS 1, ``wait_acked`` waits for the PUBACKs."""

    def __init__(self, client_id: str, port: int, *, password: str | None = None) -> None:
        self.port = port
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id)
        self.client.max_inflight_messages_set(500)
        self.client.max_queued_messages_set(0)
        if password is not None:
            self.client.username_pw_set(client_id, password)
        self.acked = 0
        self._loop = asyncio.get_running_loop()
        self._connected = asyncio.Event()
        self._progress = asyncio.Event()
        self.client.on_connect = self._t_on_connect
        self.client.on_publish = self._t_on_publish

    def _t_on_connect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self._loop.call_soon_threadsafe(self._connected.set)

    def _t_on_publish(self, c: paho.Client, u: Any, mid: int, rc: Any, props: Any) -> None:
        self._loop.call_soon_threadsafe(self._ack)

    def _ack(self) -> None:
        self.acked += 1
        self._progress.set()

    async def start(self) -> None:
        await asyncio.to_thread(self.client.connect, "127.0.0.1", self.port, 60)
        self.client.loop_start()
        async with asyncio.timeout(20):
            await self._connected.wait()

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1)

    async def wait_acked(self, n: int) -> None:
        while self.acked < n:
            self._progress.clear()
            await self._progress.wait()

    async def stop(self) -> None:
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)


async def drive(
    sc: Scenario,
    link: LinkSim,
    pump: Device,
    alarm: Device,
    topics: tuple[str, str],
    tl: Timeline,
    log: Callable[[str], None],
) -> None:
    """Load the backlog with the link silent, then drain, outage, after; alerts and link samples meanwhile."""
    rnd = random.Random(1)
    t0 = time.monotonic()
    for i in range(sc.backlog):
        pump.publish(topics[0], telemetry(i, rnd))
        if i % 1000 == 999:
            await pump.wait_acked(i - 500)
    async with asyncio.timeout(600):
        await pump.wait_acked(sc.backlog)
    log(f"backlog of {sc.backlog} acknowledged at the edge in {time.monotonic() - t0:.1f} s")
    stop = asyncio.Event()

    async def alerts() -> None:
        n = 0
        while not stop.is_set():
            mid = f"a{n}"
            tl.alerts_at[mid] = time.monotonic()
            alarm.publish(topics[1], json.dumps({"alert": "pressure", "id": mid}).encode())
            n += 1
            try:
                async with asyncio.timeout(sc.alert_every_s):
                    await stop.wait()
            except TimeoutError:
                pass

    async def sample() -> None:
        while not stop.is_set():
            tl.samples.append((time.monotonic(), link.stats.up_bytes))
            await asyncio.sleep(0.25)

    async with asyncio.TaskGroup() as tg:
        tl.restores.append(time.monotonic())
        link.restore()
        tg.create_task(alerts(), name="bench.alerts")
        tg.create_task(sample(), name="bench.sample")
        await asyncio.sleep(sc.drain_s)
        tl.outages.append(time.monotonic())
        link.go_silent()
        log("outage")
        await asyncio.sleep(sc.outage_s)
        tl.restores.append(time.monotonic())
        link.restore()
        log("restored")
        await asyncio.sleep(sc.after_s)
        if sc.cut_s > 0:
            tl.outages.append(time.monotonic())
            link.cut()
            log("hard cut")
            await asyncio.sleep(sc.cut_s)
            tl.restores.append(time.monotonic())
            link.restore()
            log("restored after the cut")
            await asyncio.sleep(sc.after_cut_s)
        tl.end = time.monotonic()
        stop.set()
    await asyncio.sleep(SETTLE_S)


def figures_from(
    sc: Scenario, tl: Timeline, link: LinkSim, arrivals: list[tuple[float, str, str, int]], backlog: int
) -> Figures:
    """``arrivals``: (received_at, kind 'p0'|'p5', id, wire bytes of the PUBLISH that carried it) in arrival
    order, duplicates included."""
    f = Figures()
    first: dict[str, float] = {}
    done_at: float | None = None
    resumed: dict[int, tuple[float, int]] = {}  # restore index -> first new backlog arrival and its wire bytes
    p5_seen = 0
    for at, kind, mid, wire in arrivals:
        if mid in first:
            continue
        first[mid] = at
        if kind == "p5":
            p5_seen += 1
            if p5_seen == backlog:
                done_at = at
            for k in range(1, len(tl.restores)):
                if k not in resumed and at >= tl.restores[k]:
                    resumed[k] = (at, wire)
    f.delivered = len(first)
    f.backlog_delivered = p5_seen
    f.up_bytes = link.stats.up_bytes
    for mid, sent in tl.alerts_at.items():
        got = first.get(mid)
        if got is None:
            f.p0_missing += 1
        wait = (got if got is not None else tl.end + SETTLE_S) - sent
        (f.p0_up_s if tl.raised_while_up(sent) else f.p0_outage_s).append(wait)
    for k, (at, wire) in resumed.items():
        arrival_s = at - tl.restores[k]
        entered_s = arrival_s - sc.delay_s - wire * 8 / sc.rate_bps
        if k == 1:
            f.resume_arrival_s, f.resume_s = arrival_s, entered_s
        else:
            f.resume_cut_arrival_s, f.resume_cut_s = arrival_s, entered_s
    spans = [*zip(tl.restores, tl.outages, strict=False), (tl.restores[-1], tl.end)]
    carried, seconds = 0, 0.0
    for start, stop in spans:
        stop = min(stop, done_at) if done_at is not None else stop
        if stop <= start:
            continue
        carried += tl.up_bytes_at(stop) - tl.up_bytes_at(start)
        seconds += stop - start
    if seconds:
        f.utilisation = carried / (sc.rate_bps / 8 * seconds)
    f.notes["drain_s_measured"] = round(seconds, 1)
    return f


def manifest(path: Path) -> None:
    routes = {
        "alerts": {
            "route": "FROM /messages/* WHERE $connectionDeviceId = 'alarm' INTO $upstream",
            "priority": 0,
            "timeToLiveSecs": 86400,
        },
        "telemetry": {
            "route": "FROM /messages/* WHERE $connectionDeviceId = 'pump' INTO $upstream",
            "priority": 5,
            "timeToLiveSecs": 604800,
        },
    }
    path.write_text(json.dumps({"schemaVersion": "1.1", "routes": routes}))


async def run_edgehub(sc: Scenario, work: Path) -> Figures:
    def log(text: str) -> None:
        print(f"edgehub: {text}", flush=True)

    await asyncio.to_thread(work.mkdir)
    data, manifest_path = work / "data", work / "manifest.json"
    manifest(manifest_path)
    store = open_store(data)
    identities = open_identities(store, DEFAULT_HOST_NAME, data_dir=data)
    for name in ("pump", "alarm"):
        await identities.set_password(Identity.parse(name), b"pw")
    await store.close()
    tl = Timeline()
    async with MosquittoPeer(work, name="cloud", way=PeerWay.BINARY) as cloud:
        link = LinkSim(target_host=cloud.host, target_port=cloud.port, rate_bps=sc.rate_bps, delay_s=sc.delay_s)
        async with link, MqttCollector(host=cloud.host, port=cloud.port, topic="edgehub/#") as sink:
            link.go_silent()
            extra: dict[str, Any] = {}
            if sc.linger_s is not None:
                extra["linger_s"] = sc.linger_s
            upstream = MqttUpstreamSettings(
                host="127.0.0.1",
                port=link.port,
                client_id="edge-hub",
                hub_id="edge",
                link_rate_bps=sc.rate_bps,
                link_rtt_s=2 * sc.delay_s,
                max_inflight_bytes=sc.window_bytes,
                max_batch_bytes=sc.batch_bytes,
                keepalive_s=sc.keepalive_s,
                compression=sc.compression,
                **extra,
            )
            config = HubConfig(manifest=manifest_path, data_dir=data, mqtt_port=0, mqtts_port=None, upstream=upstream)
            stop = asyncio.Event()
            ports: asyncio.Queue[dict[str, int]] = asyncio.Queue()
            hub = asyncio.create_task(serve(config, stop=stop, on_ready=ports.put_nowait), name="bench.hub")
            async with asyncio.timeout(30):
                port = (await ports.get())["tcp"]
            pump, alarm = Device("pump", port, password="pw"), Device("alarm", port, password="pw")
            await pump.start()
            await alarm.start()
            topics = ("devices/pump/messages/events/", "devices/alarm/messages/events/")
            try:
                await drive(sc, link, pump, alarm, topics, tl, log)
            finally:
                await pump.stop()
                await alarm.stop()
                stop.set()
                async with asyncio.timeout(30):
                    await hub
            arrivals: list[tuple[float, str, str, int]] = []
            segments = 0
            # The zstd dictionaries the hub sent (once each, before the first segment using them).
            dictionaries = {i: m.payload for m in sink.messages if (i := dictionary_id(m.payload)) is not None}
            for m in sink.messages:
                if dictionary_id(m.payload) is not None:
                    continue
                segments += 1
                wire = publish_wire_bytes(m.topic, len(m.payload))
                for r in decode_segment(m.payload, dictionaries):
                    if r.priority == 0:
                        arrivals.append((m.received_at, "p0", json.loads(r.body)["id"], wire))
                    else:
                        arrivals.append((m.received_at, "p5", r.edge_message_id, wire))
            f = figures_from(sc, tl, link, arrivals, sc.backlog)
            f.notes["segments"] = segments
            f.notes["dictionaries"] = len(dictionaries)
            f.notes["link_connections"] = link.accepted
    return f


async def run_bridge(sc: Scenario, work: Path) -> Figures:
    def log(text: str) -> None:
        print(f"bridge: {text}", flush=True)

    await asyncio.to_thread(work.mkdir)
    tl = Timeline()
    async with MosquittoPeer(work, name="cloud", way=PeerWay.BINARY) as cloud:
        link = LinkSim(target_host=cloud.host, target_port=cloud.port, rate_bps=sc.rate_bps, delay_s=sc.delay_s)
        async with link, MqttCollector(host=cloud.host, port=cloud.port, topic="#", client_id="cloud-sink") as sink:
            link.go_silent()
            bridge = [
                "max_queued_messages 10000000",
                "max_inflight_messages 20",
                "connection cloud",
                f"address 127.0.0.1:{link.port}",
                "topic tele/# out 1",
                "topic alert/# out 1",
                "bridge_protocol_version mqttv311",
                "cleansession false",
                f"keepalive_interval {sc.keepalive_s}",
                "restart_timeout 1 2",
            ]
            async with MosquittoPeer(work, name="edge", way=PeerWay.BINARY, extra_config=bridge) as edge:
                pump, alarm = Device("pump", edge.port), Device("alarm", edge.port)
                await pump.start()
                await alarm.start()
                try:
                    await drive(sc, link, pump, alarm, ("tele/pump", "alert/pressure"), tl, log)
                finally:
                    await pump.stop()
                    await alarm.stop()
            arrivals: list[tuple[float, str, str, int]] = []
            seq = 0
            for m in sink.messages:
                wire = publish_wire_bytes(m.topic, len(m.payload))
                if m.topic.startswith("alert/"):
                    arrivals.append((m.received_at, "p0", json.loads(m.payload)["id"], wire))
                else:
                    arrivals.append((m.received_at, "p5", str(json.loads(m.payload)["seq"]), wire))
                    seq += 1
            f = figures_from(sc, tl, link, arrivals, sc.backlog)
            f.notes["link_connections"] = link.accepted
    return f


async def run(sc: Scenario, work: Path, only: str | None) -> dict[str, dict[str, Any]]:
    jobs = {}
    if only in (None, "edgehub"):
        jobs["edgehub"] = run_edgehub(sc, work / "edgehub")
    if only in (None, "bridge"):
        jobs["bridge"] = run_bridge(sc, work / "bridge")
    results = await asyncio.gather(*jobs.values())
    return {name: f.summary() for name, f in zip(jobs, results, strict=True)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--backlog", type=int, default=20_000)
    ap.add_argument("--rate-bps", type=float, default=64_000)
    ap.add_argument("--delay-s", type=float, default=0.3, help="one way")
    ap.add_argument("--alert-every-s", type=float, default=5.0)
    ap.add_argument("--drain-s", type=float, default=30.0)
    ap.add_argument("--outage-s", type=float, default=60.0)
    ap.add_argument("--after-s", type=float, default=20.0)
    ap.add_argument("--cut-s", type=float, default=30.0, help="hard cut after --after-s (0: none)")
    ap.add_argument("--after-cut-s", type=float, default=40.0)
    ap.add_argument("--keepalive-s", type=int, default=30, help="both sides' MQTT keepalive upstream")
    ap.add_argument("--window-bytes", type=int, default=None, help="edgehub: bytes in flight (default: its own)")
    ap.add_argument("--batch-bytes", type=int, default=None, help="edgehub: bytes per segment (default: its own)")
    ap.add_argument("--linger-s", type=float, default=None, help="edgehub: batch linger (default: its own)")
    ap.add_argument(
        "--compression", choices=["gzip", "zstd"], default="zstd", help="edgehub: segment codec (zstd: dictionaries)"
    )
    ap.add_argument("--only", choices=["edgehub", "bridge"], default=None)
    args = ap.parse_args(argv)
    sc = Scenario(
        backlog=args.backlog,
        rate_bps=args.rate_bps,
        delay_s=args.delay_s,
        alert_every_s=args.alert_every_s,
        drain_s=args.drain_s,
        outage_s=args.outage_s,
        after_s=args.after_s,
        cut_s=args.cut_s,
        after_cut_s=args.after_cut_s,
        window_bytes=args.window_bytes,
        batch_bytes=args.batch_bytes,
        linger_s=args.linger_s,
        keepalive_s=args.keepalive_s,
        compression=Codec(args.compression),
    )
    if sc.outage_s <= 1.5 * sc.keepalive_s:
        print(f"warning: outage {sc.outage_s} s <= 1.5 x keepalive: resume may count bytes held in the link")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    print(
        f"scenario: backlog {sc.backlog} x 200 B P5, P0 every {sc.alert_every_s} s, link {sc.rate_bps / 1000:g} "
        f"kbit/s {sc.delay_s * 1000:g} ms one way; drain {sc.drain_s} s, silent outage {sc.outage_s} s, then "
        f"{sc.after_s} s, hard cut {sc.cut_s} s, then {sc.after_cut_s} s; edgehub codec {sc.compression}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-uplink-") as tmp:
        res = asyncio.run(run(sc, Path(tmp), args.only))
    for name, figs in res.items():
        print(f"{name:8s} " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figs.items()))
    e, b = res.get("edgehub", {}), res.get("bridge", {})
    ew, bw = e.get("wire_bytes_per_msg"), b.get("wire_bytes_per_msg")
    print(
        json.dumps(
            {
                "p0_p50_s": e.get("p0_p50_s"),
                "p0_p99_s": e.get("p0_p99_s"),
                "bridge_p0_p99_s": b.get("p0_p99_s"),
                "wire_bytes_per_msg": ew,
                "bridge_wire_bytes_per_msg": bw,
                "wire_ratio": ew / bw if ew and bw else None,
                "utilisation": e.get("utilisation"),
                "resume_s": e.get("resume_s"),
                "resume_cut_s": e.get("resume_cut_s"),
                "bridge_p0_p50_s": b.get("p0_p50_s"),
                "bridge_utilisation": b.get("utilisation"),
                "bridge_resume_s": b.get("resume_s"),
                "bridge_resume_cut_s": b.get("resume_cut_s"),
                "resume_arrival_s": e.get("resume_arrival_s"),
                "resume_cut_arrival_s": e.get("resume_cut_arrival_s"),
                "bridge_resume_arrival_s": b.get("resume_arrival_s"),
                "p0_outage_max_s": e.get("p0_outage_max_s"),
                "delivered": e.get("delivered"),
                "bridge_delivered": b.get("delivered"),
                "backlog": sc.backlog,
                "backlog_delivered": e.get("backlog_delivered"),
                "bridge_backlog_delivered": b.get("backlog_delivered"),
                "p0_missing": e.get("p0_missing"),
                "bridge_p0_missing": b.get("p0_missing"),
                "load_avg": round(os.getloadavg()[0], 2),
                "scaled": sc.backlog < 50_000 or sc.outage_s < 60,
            }
        )
    )


if __name__ == "__main__":
    main()
