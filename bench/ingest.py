"""Ingest and module-to-module throughput of the edgehub process against Debian's Mosquitto (persistence on).

``python -m bench.ingest [--publishers 4] [--messages 20000] [--m2m 20000] [--rounds 1]``
(``--protocol amqp``: the same ingest workload over AMQP 1.0, ``bench/ingest_amqp.py``)

1. Telemetry: ``--publishers`` paho-mqtt processes each send ``--messages`` QoS1 200-byte messages (up to 64 in
   flight) to the broker; a subscriber (an edgehub module on its input; a plain subscriber on Mosquitto) receives
   them all. Reported: end-to-end msgs/s (first publish to last receipt) and the broker process's CPU time per
   message from /proc (user+system), for both, and their ratio. edgehub runs with ``fsync=always`` (a PUBACK
   means synced); Mosquitto's persistence writes its database on shutdown/autosave only, never per message.
   The same telemetry runs over RabbitMQ's MQTT plugin (``bench/rabbitmq.py``, when ``rabbitmq-server`` is
   installed), the durable peer: its sink keeps a durable queue, and a QoS 1 PUBACK comes once that queue wrote it.
2. Module to module: a module sends ``--m2m`` messages to its output, routed to another module's input, SDK-style
   topics; throughput and p50/p99 latency (send to receipt, one clock). The sender and the receiver are separate
   processes. The same clients run against Mosquitto (the receiver subscribed to the sender's topic), which says
   what the clients themselves can do on this machine: ``mosquitto_m2m_msgs_per_s``.
CPU per message is steady-state CPU: a broker's CPU is read ``SETTLE_S`` after the last receipt (both brokers),
and edgehub runs with ``--cleanup-interval CLEANUP_S``, so removing what it delivered from its store (which
Mosquitto does as it delivers) is inside the measured window, as it is in a hub that runs for hours.
Last line: one JSON object. With ``--rounds N`` both brokers run N times, one after the other, and the JSON
gives medians (``cpu_ratio``: the median of the rounds' ratios): figures move by about 10 % between runs on a
shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edgehub.core.sas import ConnectionString
from edgehub.runtime.compose.store import open_store

BODY = b"x" * 200
MODULE_WINDOW = 64  # deliveries in flight to the subscriber, the same for both brokers
CLEANUP_S = 0.5  # edgehub's cleanup interval here (60 s by default)
SETTLE_S = 0.8  # from the last receipt to the CPU reading: edgehub's last cleanup of the phase is in it
EDGEHUB = str(Path(sys.executable).parent / "edgehub")
MANIFEST = {
    "schemaVersion": "1.1",
    "routes": {
        "telemetry": (
            "FROM /messages/* WHERE $connectionDeviceId != 'edge' INTO BrokeredEndpoint('/modules/sink/inputs/in')"
        ),
        "m2m": "FROM /messages/modules/src/outputs/out INTO BrokeredEndpoint('/modules/sink/inputs/m2m')",
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client(client_id: str, port: int, cs: ConnectionString | None, *, clean: bool = True) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311, clean_session=clean)
    c.max_inflight_messages_set(64)
    c.max_queued_messages_set(0)
    if cs is not None:
        c.username_pw_set(f"{cs.host_name}/{client_id}/?api-version=2021-04-12", cs.sas_token(int(time.time()) + 3600))
    c.connect("127.0.0.1", port, 60)
    return c


def publisher(client_id: str, port: int, cs_text: str | None, topic: str, count: int, start: Any) -> None:
    cs = ConnectionString.parse(cs_text) if cs_text else None
    c = client(client_id, port, cs)
    done = threading.Event()
    acked = 0

    def on_publish(*_: Any) -> None:
        nonlocal acked
        acked += 1
        if acked == count:
            done.set()

    c.on_publish = on_publish
    c.loop_start()
    start.wait()
    for _ in range(count):
        while len(c._out_messages) >= 256:  # keep paho's own queue short; the window is 64 in flight
            time.sleep(0.0005)
        c.publish(topic, BODY, qos=1)
    done.wait(300)
    c.disconnect()
    c.loop_stop()


class Sink:
    def __init__(
        self, client_id: str, port: int, cs: ConnectionString | None, topic: str, expect: int, *, clean: bool = True
    ) -> None:
        self.expect = expect
        self.count = 0
        self.latencies: list[float] = []
        self.last = 0.0
        self.done = threading.Event()
        self.c = client(client_id, port, cs, clean=clean)
        self.c.on_message = self._on_message
        subscribed = threading.Event()
        self.c.on_subscribe = lambda *_: subscribed.set()
        self.c.loop_start()
        self.c.subscribe(topic, qos=1)
        subscribed.wait(10)

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        now = time.perf_counter()
        if msg.payload[:1] == b"t":
            self.latencies.append(now - float(msg.payload[1:30].decode()))
        self.count += 1
        self.last = now
        if self.count >= self.expect:
            self.done.set()

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def telemetry(
    port: int,
    pid: int,
    creds: dict[str, str] | None,
    n_pub: int,
    n_msg: int,
    sink_id: str,
    sub: str,
    *,
    cpu: Callable[[], float] | None = None,
    durable: bool = False,
) -> tuple[float, float]:
    """``cpu``: the broker's CPU seconds (default: process ``pid``'s); ``durable``: the sink keeps its session (a
    broker's durable queue for it)."""
    cpu_of = cpu if cpu is not None else (lambda: cpu_s(pid))
    sink = Sink(
        sink_id, port, ConnectionString.parse(creds[sink_id]) if creds else None, sub, n_pub * n_msg, clean=not durable
    )
    start = mp.Event()
    procs = [
        mp.Process(
            target=publisher,
            args=(
                f"pub{i}",
                port,
                creds[f"pub{i}"] if creds else None,
                f"devices/pub{i}/messages/events/",
                n_msg,
                start,
            ),
        )
        for i in range(n_pub)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let every publisher connect (outside the measured window)
    cpu0, t0 = cpu_of(), time.perf_counter()
    start.set()
    ok = sink.done.wait(240)
    time.sleep(SETTLE_S)
    t1, cpu1 = sink.last, cpu_of()
    for p in procs:
        p.join(30)
    sink.close()
    if not ok:
        raise RuntimeError(f"only {sink.count} of {sink.expect} messages arrived")
    total = n_pub * n_msg
    return total / (t1 - t0), (cpu1 - cpu0) / total * 1e6


def m2m_source(client_id: str, port: int, cs_text: str | None, topic: str, count: int, start: Any) -> None:
    """The sending module, in its own process: it stamps each body with the send time (``time.perf_counter`` is
    CLOCK_MONOTONIC, one clock for all processes of the machine)."""
    src = client(client_id, port, ConnectionString.parse(cs_text) if cs_text else None)
    src.loop_start()
    start.wait()
    for _ in range(count):
        while len(src._out_messages) >= 64:
            time.sleep(0.0002)
        src.publish(topic, b"t%.9f" % time.perf_counter(), qos=1)
    while src._out_messages:  # every PUBACK in before disconnecting
        time.sleep(0.01)
    src.disconnect()
    src.loop_stop()


def m2m(
    port: int, pid: int, creds: dict[str, str] | None, count: int, src_id: str, sink_id: str, sub: str
) -> tuple[float, float, float, float]:
    """Module to module: the source and the sink each in their own process (in one, paho's two loops share a GIL
    and cap the run at about 4,000 msg/s, whatever the broker)."""
    sink = Sink(sink_id, port, ConnectionString.parse(creds[sink_id]) if creds else None, sub, count)
    start = mp.Event()
    proc = mp.Process(
        target=m2m_source,
        args=(
            src_id,
            port,
            creds[src_id] if creds else None,
            "devices/edge/modules/src/messages/events/$.on=out",
            count,
            start,
        ),
    )
    proc.start()
    time.sleep(1.0)  # connected, outside the measured window
    cpu0, t0 = cpu_s(pid), time.perf_counter()
    start.set()
    ok = sink.done.wait(240)
    time.sleep(SETTLE_S)
    t1, cpu1 = sink.last, cpu_s(pid)
    proc.join(30)
    sink.close()
    if not ok:
        raise RuntimeError(f"m2m: only {sink.count} of {count} arrived")
    lat = sorted(sink.latencies)
    return count / (t1 - t0), lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3, (cpu1 - cpu0) / count * 1e6


def add_identities(data: Path, idents: list[str]) -> dict[str, str]:
    """``edgehub identity add`` for each ``device`` or ``device/module``: their connection strings."""
    creds: dict[str, str] = {}
    for ident in idents:
        device, _, module = ident.partition("/")
        extra = ["--module", module] if module else []
        out = subprocess.run(
            [EDGEHUB, "identity", "add", device, *extra, "--data-dir", str(data)],
            check=True,
            capture_output=True,
            text=True,
        )
        creds[ident] = out.stdout.strip()
    return creds


def hub_run_args(manifest: Path, data: Path, port: int) -> list[str]:
    """``edgehub run``'s arguments here: plain MQTT on ``port``, the same outbound window as Mosquitto's
    max_inflight_messages (so both deliver alike), cleanup every ``CLEANUP_S``."""
    return [
        "run",
        "--manifest",
        str(manifest),
        "--data-dir",
        str(data),
        "--mqtt-port",
        str(port),
        "--mqtts-port",
        "0",
        "--amqps-port",
        "0",
        "--admin-port",
        "0",
        "--module-window",
        str(MODULE_WINDOW),
        "--cleanup-interval",
        str(CLEANUP_S),
    ]


def mosquitto_conf(work: Path, port: int, *extra: str) -> Path:
    """Mosquitto's configuration for these benchmarks: persistence on, the hub's delivery window."""
    conf = work / "mosquitto.conf"
    (work / "mosq").mkdir()
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {work / 'mosq'}/\n"
        f"max_inflight_messages {MODULE_WINDOW}\nmax_queued_messages 100000\n" + "".join(f"{line}\n" for line in extra)
    )
    return conf


def run_edgehub(work: Path, args: argparse.Namespace) -> dict[str, float]:
    data = work / "edgehub"
    manifest = work / "manifest.json"
    manifest.write_text(json.dumps(MANIFEST))
    creds = add_identities(data, [f"pub{i}" for i in range(args.publishers)] + ["edge/sink", "edge/src"])
    port = free_port()
    # EDGEHUB_BENCH_PROFILE=FILE runs the hub under pyinstrument (text report to FILE) to see where CPU goes.
    profile = os.environ.get("EDGEHUB_BENCH_PROFILE")
    prefix = [sys.executable, "-m", "pyinstrument", "-o", profile, EDGEHUB] if profile else [EDGEHUB]
    run_args = [*hub_run_args(manifest, data, port), "--event-loop", args.event_loop]
    proc = subprocess.Popen([*prefix, *run_args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if re.search(r"listening:", line):
                break
        rate, cpu = telemetry(
            port, proc.pid, creds, args.publishers, args.messages, "edge/sink", "devices/edge/modules/sink/inputs/#"
        )
        m_rate, p50, p99, m_cpu = m2m(
            port, proc.pid, creds, args.m2m, "edge/src", "edge/sink", "devices/edge/modules/sink/inputs/#"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    left = asyncio.run(messages_left(data))
    print(f"edgehub: {left} messages left in its store after the run (each phase's cleanup is in its window)")
    return {"rate": rate, "cpu": cpu, "m2m": m_rate, "p50": p50, "p99": p99, "m2m_cpu": m_cpu}


async def messages_left(data: Path) -> int:
    store = open_store(data)
    try:
        return store.usage()[0]
    finally:
        await store.close()


def run_mosquitto(work: Path, args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    conf = mosquitto_conf(work, port)
    proc = subprocess.Popen(
        [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)], stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        rate, cpu = telemetry(
            port, proc.pid, None, args.publishers, args.messages, "sink", "devices/+/messages/events/#"
        )
        m_rate, p50, p99, m_cpu = m2m(
            port, proc.pid, None, args.m2m, "src", "m2m-sink", "devices/edge/modules/src/messages/#"
        )
    finally:
        proc.terminate()
        proc.wait(30)
    return {"rate": rate, "cpu": cpu, "m2m": m_rate, "p50": p50, "p99": p99, "m2m_cpu": m_cpu}


def run_rabbitmq_mqtt(work: Path, args: argparse.Namespace) -> dict[str, float] | None:
    """The same telemetry over RabbitMQ's MQTT plugin, the durable peer: QoS 1 into the sink's durable queue,
    PUBACK once written (Mosquitto acks before any sync). None when RabbitMQ is not installed."""
    from bench import rabbitmq  # psutil and RabbitMQ: only for this peer

    if not rabbitmq.available():
        return None
    with rabbitmq.RabbitMq(work) as rmq:
        rate, cpu = telemetry(
            rmq.mqtt_port,
            0,
            None,
            args.publishers,
            args.messages,
            "rsink",
            "devices/+/messages/events/#",
            cpu=rmq.cpu_s,
            durable=True,
        )
    return {"rate": rate, "cpu": cpu}


def m2m_text(r: dict[str, float]) -> str:
    return f"{r['m2m']:.0f} msgs/s, p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, {r['m2m_cpu']:.1f} CPU us/msg"


def main() -> None:
    if "--protocol" in sys.argv and sys.argv[sys.argv.index("--protocol") + 1 :][:1] == ["amqp"]:
        from bench import ingest_amqp  # the AMQP run: its own module (proton clients, RabbitMQ's AMQP 1.0)

        ingest_amqp.main(sys.argv[1:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocol", choices=["mqtt", "amqp"], default="mqtt", help="amqp: bench.ingest_amqp's run")
    ap.add_argument("--publishers", type=int, default=4)
    # /proc gives CPU time in clock ticks (10 ms): at ~6 us a message, Mosquitto's 20,000 were 12 ticks, and one
    # tick more or less moved the ratio by 8 %. 80,000 messages keep that under 2 % on a fast host.
    ap.add_argument("--messages", type=int, default=20000, help="per publisher")
    ap.add_argument("--m2m", type=int, default=20000)
    ap.add_argument(
        "--rounds", type=int, default=1, help="Mosquitto then edgehub, this many times; the JSON gives medians"
    )
    ap.add_argument(
        "--event-loop", choices=["uvloop", "asyncio"], default="uvloop", help="the hub's event loop (edgehub run's)"
    )
    args = ap.parse_args()
    mosqs: list[dict[str, float]] = []
    edges: list[dict[str, float]] = []
    rabbits: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        for n in range(args.rounds):
            work = Path(tmp) / f"round{n}"
            work.mkdir()
            mosq = run_mosquitto(work, args)
            print(f"mosquitto: {mosq['rate']:.0f} msgs/s end to end, {mosq['cpu']:.1f} CPU us/msg (broker)")
            print(f"mosquitto, module to module: {m2m_text(mosq)}")
            rabbit = run_rabbitmq_mqtt(work, args)
            if rabbit is not None:
                print(
                    f"rabbitmq mqtt (durable): {rabbit['rate']:.0f} msgs/s end to end, {rabbit['cpu']:.1f} CPU us/msg"
                )
                rabbits.append(rabbit)
            edge = run_edgehub(work, args)
            print(f"edgehub:   {edge['rate']:.0f} msgs/s end to end, {edge['cpu']:.1f} CPU us/msg (hub, fsync always)")
            print(f"edgehub, module to module: {m2m_text(edge)}")
            mosqs.append(mosq)
            edges.append(edge)
    # Each round's pair ran back to back, so the ratio is taken per round, then the median of those.
    ratios = [e["cpu"] / m["cpu"] for e, m in zip(edges, mosqs, strict=True) if m["cpu"]]
    edge = {k: statistics.median([e[k] for e in edges]) for k in edges[0]}
    mosq = {k: statistics.median([m[k] for m in mosqs]) for k in mosqs[0]}
    result = {
        "edgehub_msgs_per_s": round(edge["rate"], 1),
        "mosquitto_msgs_per_s": round(mosq["rate"], 1),
        "edgehub_cpu_us_per_msg": round(edge["cpu"], 1),
        "mosquitto_cpu_us_per_msg": round(mosq["cpu"], 1),
        "cpu_ratio": round(statistics.median(ratios), 2) if ratios else None,  # None: too short to tell
        "m2m_msgs_per_s": round(edge["m2m"], 1),
        "m2m_p50_ms": round(edge["p50"], 2),
        "m2m_p99_ms": round(edge["p99"], 2),
        "mosquitto_m2m_msgs_per_s": round(mosq["m2m"], 1),
        "mosquitto_m2m_p50_ms": round(mosq["p50"], 2),
        "mosquitto_m2m_p99_ms": round(mosq["p99"], 2),
        "m2m_cpu_us_per_msg": round(edge["m2m_cpu"], 1),
        "mosquitto_m2m_cpu_us_per_msg": round(mosq["m2m_cpu"], 1),
        # RabbitMQ's MQTT plugin (durable queue), None where rabbitmq-server is not installed.
        "rabbitmq_mqtt_msgs_per_s": round(statistics.median(r["rate"] for r in rabbits), 1) if rabbits else None,
        "rabbitmq_mqtt_cpu_us_per_msg": round(statistics.median(r["cpu"] for r in rabbits), 1) if rabbits else None,
        "rounds": args.rounds,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
