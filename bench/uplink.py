"""python -m bench.uplink: the upstream over a thin link, edgehub's MQTT transport vs a Mosquitto bridge.

Usage::

    python -m bench.uplink                      # scaled default run, about 2.5 minutes
    python -m bench.uplink --backlog 50000 --outage-s 60 --drain-s 120 --after-s 120   # the issue's scenario

Both sides run the same scenario through their own ``LinkSim`` (default 64 kbit/s, 300 ms one way) in front
of a cloud Mosquitto: a backlog of priority-5 telemetry (200-byte JSON), a priority-0 alert every 5 s, the link
going silent for ``--outage-s`` after ``--drain-s`` seconds, then ``--after-s`` seconds more.

* **edgehub**: ``MqttUpstream`` in ``batch`` mode, driven by a *simple local sender loop* standing in for the
  endpoint executor (not built yet): strict priority (P0 first), ``--batch-messages`` per send, failed batches
  put back at the head, waits for ``on_reachable`` after a failure. No store, no checkpointer: what this
  measures is the transport and the wire format, not the executor.
* **bridge**: Debian's mosquitto as the edge broker (fed by ``mosquitto_pub``), bridged (QoS 1) to the cloud
  Mosquitto through the link; FIFO, one message per PUBLISH, as Mosquitto bridges do.

Figures: P0 latency p50/p99 (alerts not delivered by the end count as the time they waited so far: a lower
bound), wire bytes per delivered message (all bytes the link carried up / messages delivered), link
utilisation while draining (bytes carried up over rate x time while the link was up and backlog remained),
and resume (from link restore to the first backlog message arriving in the cloud).

Not covered yet (needs the executor and store, issue 3): durable queues, TTL, restart while offline, the
executor's cut-short of retry waits; the sender loop here keeps the backlog in memory.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from edgehub.core import Message
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer, PeerWay
from edgehub.upstream.mqtt_transport import MqttUpstream, MqttUpstreamSettings
from edgehub.upstream.segment import decode_segment


@dataclass
class Scenario:
    backlog: int
    rate_bps: float
    delay_s: float
    alert_every_s: float
    drain_s: float
    outage_s: float
    after_s: float
    batch_messages: int
    window_bytes: int | None
    segment_bytes: int | None


@dataclass
class Figures:
    p0_latencies_s: list[float] = field(default_factory=list)
    p0_up_latencies_s: list[float] = field(default_factory=list)  # alerts raised while the link was up
    delivered: int = 0
    up_bytes: int = 0
    draining_bytes: int = 0
    draining_s: float = 0.0
    resume_s: float | None = None

    def summary(self, rate_bps: float) -> dict[str, float | None]:
        def pct(values: list[float], q: float) -> float | None:
            lat = sorted(values)
            if not lat:
                return None
            return lat[min(len(lat) - 1, round(q * (len(lat) - 1)))]

        return {
            "p0_p50_s": pct(self.p0_latencies_s, 0.5),
            "p0_p99_s": pct(self.p0_latencies_s, 0.99),
            "p0_up_p50_s": pct(self.p0_up_latencies_s, 0.5),
            "p0_up_p99_s": pct(self.p0_up_latencies_s, 0.99),
            "p0_count": len(self.p0_latencies_s),
            "delivered": self.delivered,
            "wire_bytes_per_msg": self.up_bytes / self.delivered if self.delivered else None,
            "utilisation": self.draining_bytes / (rate_bps / 8 * self.draining_s) if self.draining_s else None,
            "resume_s": self.resume_s,
        }


def _telemetry(i: int, rnd: random.Random) -> bytes:
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


async def _phases(
    sc: Scenario, link: LinkSim, figures: Figures, stop: asyncio.Event, restored: list[float], backlog_left: list[int]
) -> None:
    """Drain, outage, after: sample the link's byte counts for utilisation while backlog remains."""
    t0, b0 = time.monotonic(), link.stats.up_bytes
    await asyncio.sleep(sc.drain_s)
    figures.draining_s += time.monotonic() - t0
    figures.draining_bytes += link.stats.up_bytes - b0
    link.go_silent()
    await asyncio.sleep(sc.outage_s)
    link.restore()
    restored.append(time.monotonic())
    t1, b1 = time.monotonic(), link.stats.up_bytes
    end = t1 + sc.after_s
    while time.monotonic() < end and backlog_left[0] > 0:  # noqa: ASYNC110 (sampling a counter, no event)
        await asyncio.sleep(0.2)
    figures.draining_s += time.monotonic() - t1
    figures.draining_bytes += link.stats.up_bytes - b1
    await asyncio.sleep(max(0.0, end - time.monotonic()) if backlog_left[0] == 0 else 0)
    stop.set()


async def run_edgehub(sc: Scenario, work: Path) -> Figures:
    figures = Figures()
    rnd = random.Random(1)
    async with MosquittoPeer(work, name="cloud-e", way=PeerWay.BINARY) as cloud:
        link = LinkSim(target_host=cloud.host, target_port=cloud.port, rate_bps=sc.rate_bps, delay_s=sc.delay_s)
        async with link, MqttCollector(host=cloud.host, port=cloud.port, topic="edgehub/#") as sink:
            settings = MqttUpstreamSettings(
                host="127.0.0.1",
                port=link.port,
                client_id="edge-hub",
                hub_id="edge",
                link_rate_bps=sc.rate_bps,
                link_rtt_s=2 * sc.delay_s,
                max_batch_messages=sc.batch_messages,
                max_inflight_bytes=sc.window_bytes,
                max_batch_bytes=sc.segment_bytes,
                keepalive_s=10,
                ack_timeout_s=10,
                reconnect_min_s=0.2,
                reconnect_max_s=2,
            )
            up = MqttUpstream(settings)
            reachable = asyncio.Event()
            up.bind(reachable.set)
            p5: deque[QueuedMessage] = deque(
                QueuedMessage(
                    message=Message(body=_telemetry(i, rnd), system_properties={"edgeMessageId": f"t{i}"}),
                    offset=i,
                    priority=5,
                    enqueued_at_s=time.time(),
                    ttl_s=86400,
                )
                for i in range(sc.backlog)
            )
            p0: deque[QueuedMessage] = deque()
            sent_at: dict[str, float] = {}
            up_at: dict[str, bool] = {}
            stop = asyncio.Event()
            restored: list[float] = []
            left = [len(p5)]

            async def alerts() -> None:
                n = 0
                while not stop.is_set():
                    mid = f"a{n}"
                    sent_at[mid] = time.monotonic()
                    up_at[mid] = link.is_up
                    body = json.dumps({"alert": "pressure", "id": mid}).encode()
                    p0.append(
                        QueuedMessage(
                            message=Message(body=body, system_properties={"edgeMessageId": mid}),
                            offset=n,
                            priority=0,
                            enqueued_at_s=time.time(),
                            ttl_s=86400,
                        )
                    )
                    n += 1
                    await asyncio.sleep(sc.alert_every_s)

            async def sender() -> None:
                await up.wait_connected()
                while not stop.is_set():
                    queue = p0 if p0 else p5
                    if not queue:
                        await asyncio.sleep(0.05)
                        continue
                    batch = [queue.popleft() for _ in range(min(sc.batch_messages, len(queue)))]
                    result = await up.send(batch)
                    if result.failed:
                        queue.extendleft(reversed(result.failed))
                        reachable.clear()
                        try:
                            async with asyncio.timeout(1.0):
                                await reachable.wait()
                        except TimeoutError:
                            pass
                    left[0] = len(p5)

            async with up:
                await up.wait_connected()
                async with asyncio.TaskGroup() as tg:
                    tasks = [
                        tg.create_task(alerts(), name="bench.alerts"),
                        tg.create_task(sender(), name="bench.sender"),
                    ]
                    await _phases(sc, link, figures, stop, restored, left)
                    for t in tasks:
                        t.cancel()
            end = time.monotonic()
            delivered_p0: dict[str, float] = {}
            first_after_restore: float | None = None
            for m in sink.messages:
                for r in decode_segment(m.payload):
                    if r.priority == 0:
                        delivered_p0.setdefault(r.edge_message_id, m.received_at)
                    else:
                        figures.delivered += 1
                        if restored and m.received_at >= restored[0] + sc.delay_s and first_after_restore is None:
                            first_after_restore = m.received_at
            for mid, at in sent_at.items():
                figures.p0_latencies_s.append(delivered_p0.get(mid, end) - at)
                if up_at[mid]:
                    figures.p0_up_latencies_s.append(delivered_p0.get(mid, end) - at)
            figures.delivered += len(delivered_p0)
            figures.up_bytes = link.stats.up_bytes
            if first_after_restore is not None:
                figures.resume_s = first_after_restore - restored[0]
            status = up.status()
            print(
                f"edgehub: transport wire bytes/msg {status.wire_bytes_per_message:.1f}, "
                f"peak in flight {status.peak_inflight_bytes} B (window {status.window_bytes} B), "
                f"connects {status.connects}, P0 delivered {len(delivered_p0)}/{len(sent_at)}"
            )
    return figures


async def run_bridge(sc: Scenario, work: Path) -> Figures:
    figures = Figures()
    rnd = random.Random(1)
    async with MosquittoPeer(work, name="cloud-b", way=PeerWay.BINARY) as cloud:
        link = LinkSim(target_host=cloud.host, target_port=cloud.port, rate_bps=sc.rate_bps, delay_s=sc.delay_s)
        async with link, MqttCollector(host=cloud.host, port=cloud.port, topic="#", client_id="cloud-sink") as sink:
            bridge = [
                "max_queued_messages 10000000",
                "connection cloud",
                f"address 127.0.0.1:{link.port}",
                "topic tele/# out 1",
                "topic alert/# out 1",
                "bridge_protocol_version mqttv311",
                "cleansession false",
                "keepalive_interval 10",
                "restart_timeout 1 2",
            ]
            async with MosquittoPeer(work, name="edge-b", way=PeerWay.BINARY, extra_config=bridge) as edge:
                lines = b"\n".join(_telemetry(i, rnd) for i in range(sc.backlog)) + b"\n"
                pub = await asyncio.create_subprocess_exec(
                    "mosquitto_pub", "-h", edge.host, "-p", str(edge.port), "-t", "tele/pump", "-q", "1", "-l",
                    stdin=asyncio.subprocess.PIPE,
                )  # fmt: skip
                await pub.communicate(lines)
                stop = asyncio.Event()
                restored: list[float] = []
                sent_at: dict[str, float] = {}
                up_at: dict[str, bool] = {}
                left = [sc.backlog]

                async def alerts() -> None:
                    n = 0
                    while not stop.is_set():
                        mid = f"a{n}"
                        sent_at[mid] = time.monotonic()
                        up_at[mid] = link.is_up
                        p = await asyncio.create_subprocess_exec(
                            "mosquitto_pub", "-h", edge.host, "-p", str(edge.port), "-t", "alert/pressure", "-q", "1",
                            "-m", json.dumps({"alert": "pressure", "id": mid}),
                        )  # fmt: skip
                        await p.wait()
                        n += 1
                        await asyncio.sleep(sc.alert_every_s)

                async def count_left() -> None:
                    while not stop.is_set():
                        left[0] = sc.backlog - sum(1 for m in sink.messages if m.topic.startswith("tele/"))
                        await asyncio.sleep(0.5)

                async with asyncio.TaskGroup() as tg:
                    tasks = [
                        tg.create_task(alerts(), name="bench.bridge_alerts"),
                        tg.create_task(count_left(), name="bench.bridge_left"),
                    ]
                    await _phases(sc, link, figures, stop, restored, left)
                    for t in tasks:
                        t.cancel()
                end = time.monotonic()
                delivered_p0: dict[str, float] = {}
                first_after_restore: float | None = None
                for m in sink.messages:
                    if m.topic.startswith("alert/"):
                        delivered_p0.setdefault(json.loads(m.payload)["id"], m.received_at)
                    else:
                        figures.delivered += 1
                        if restored and m.received_at >= restored[0] + sc.delay_s and first_after_restore is None:
                            first_after_restore = m.received_at
                for mid, at in sent_at.items():
                    figures.p0_latencies_s.append(delivered_p0.get(mid, end) - at)
                    if up_at[mid]:
                        figures.p0_up_latencies_s.append(delivered_p0.get(mid, end) - at)
                figures.delivered += len(delivered_p0)
                figures.up_bytes = link.stats.up_bytes
                if first_after_restore is not None:
                    figures.resume_s = first_after_restore - restored[0]
                print(f"bridge: P0 delivered {len(delivered_p0)}/{len(sent_at)}")
    return figures


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--backlog", type=int, default=50_000)
    ap.add_argument("--rate-bps", type=float, default=64_000)
    ap.add_argument("--delay-s", type=float, default=0.3)
    ap.add_argument("--alert-every-s", type=float, default=5.0)
    ap.add_argument("--drain-s", type=float, default=25.0)
    ap.add_argument("--outage-s", type=float, default=30.0)
    ap.add_argument("--after-s", type=float, default=20.0)
    ap.add_argument("--batch-messages", type=int, default=500)
    ap.add_argument("--window-bytes", type=int, default=None, help="edgehub bytes in flight (default: one BDP)")
    ap.add_argument("--segment-bytes", type=int, default=None, help="edgehub segment size (default: window/4)")
    args = ap.parse_args(argv)
    sc = Scenario(
        backlog=args.backlog,
        rate_bps=args.rate_bps,
        delay_s=args.delay_s,
        alert_every_s=args.alert_every_s,
        drain_s=args.drain_s,
        outage_s=args.outage_s,
        after_s=args.after_s,
        batch_messages=args.batch_messages,
        window_bytes=args.window_bytes,
        segment_bytes=args.segment_bytes,
    )
    logging.basicConfig(level=logging.WARNING)
    print(
        f"scenario: backlog {sc.backlog} x 200 B P5, P0 every {sc.alert_every_s} s, link {sc.rate_bps / 1000:g} "
        f"kbit/s {sc.delay_s * 1000:g} ms one way; drain {sc.drain_s} s, silent outage {sc.outage_s} s, "
        f"then {sc.after_s} s; edgehub batch {sc.batch_messages} msgs/send"
    )
    with tempfile.TemporaryDirectory(prefix="bench-uplink-") as tmp:
        e = asyncio.run(run_edgehub(sc, Path(tmp))).summary(sc.rate_bps)
        b = asyncio.run(run_bridge(sc, Path(tmp))).summary(sc.rate_bps)
    for name, f in (("edgehub", e), ("bridge", b)):
        print(f"{name:8s} " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in f.items()))
    ew, bw = e["wire_bytes_per_msg"], b["wire_bytes_per_msg"]
    if ew and bw:
        print(f"wire bytes per message: edgehub/bridge = {ew / bw:.3f}")
    print(
        json.dumps(
            {
                "p0_p50_s": e["p0_p50_s"],
                "p0_p99_s": e["p0_p99_s"],
                "bridge_p0_p99_s": b["p0_p99_s"],
                "p0_up_p99_s": e["p0_up_p99_s"],
                "bridge_p0_up_p99_s": b["p0_up_p99_s"],
                "wire_bytes_per_msg": ew,
                "bridge_wire_bytes_per_msg": bw,
                "utilisation": e["utilisation"],
                "bridge_utilisation": b["utilisation"],
                "resume_s": e["resume_s"],
                "bridge_resume_s": b["resume_s"],
                "delivered": e["delivered"],
                "bridge_delivered": b["delivered"],
                "scaled": sc.outage_s < 60 or sc.backlog < 50_000,
            }
        )
    )


if __name__ == "__main__":
    main()
