"""The hub's footprint on a small gateway, under the Pi Zero 2 W profile: start-up time, memory idle and with a
large backlog.

Usage: python -m bench.footprint [--queued 1000000] [--devices 10] [--profile pi-zero2w] [--dir PATH] [--plain]

The hub runs as ``deployment/edgehub.service`` runs it: with the unit's ``Environment=`` lines (Python's ``-OO`` and
a bytecode cache directory, ``%C`` taken as a directory of this run; ``service_environment``), so the first start
(the warm-up below) writes the cache that every later start reads, as on a gateway. ``--plain`` runs it in this
shell's environment instead.

1. ``startup_s``: from the exec of ``edgehub run --profile pi-zero2w`` (TLS on, a fresh data directory: its
   certificates already made, as on every start but the first) to the first accepted connection: a device's
   TLS handshake and CONNECT answered with CONNACK 0 (the device tries again every 10 ms until then).
2. ``rss_idle_mb``: the hub's RSS with ``--devices`` devices connected over TLS and idle (read after 2 s quiet).
3. ``rss_1m_mb``: the hub's RSS once ``--queued`` messages (200-byte bodies, QoS 1, from 4 publishers over plain
   MQTT) are acknowledged and held in its store: ``$upstream``'s link is down (the upstream broker does not
   answer), as in the outage that makes a backlog; read after 2 s quiet, the devices still connected. Also its
   peak (``rss_peak_mb``, VmHWM) while they came in.

4. ``restart_s``, ``rss_restart_mb``: the hub stopped (SIGTERM) and started again with that backlog: the time to
   the first accepted connection (a start reads every record of the store with its checksum first), its RSS
   then and its peak.

Where the memory goes, at each point: the RSS by mapping from /proc/PID/smaps (the Python heap and
allocations, the RocksDB library, libpython, OpenSSL, ...) and RocksDB's own gauges are printed; the figures to
compare with are the peers' on small devices: Azure IoT Edge's hub 57 to 166 MB, Greengrass's stream manager at
least 70 MB. Targets: idle <= 45 MB, 1M queued <= 80 MB, start-up <= 1.5 s.

Last line: one JSON object with rss_idle_mb, rss_1m_mb, rss_peak_mb, startup_s, queued, restart_s, rss_restart_mb,
rss_restart_peak_mb.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from bench.ingest import add_identities, free_port
from edgehub.core.sas import ConnectionString

EDGEHUB = str(Path(sys.executable).parent / "edgehub")
SERVICE_UNIT = Path(__file__).resolve().parents[1] / "deployment" / "edgehub.service"
BODY = b"x" * 200
PUBLISHERS = 4
INFLIGHT = 256  # per publisher: under fsync=interval an ack waits up to one interval, so many must be in flight
QUIET_S = 2.0
MANIFEST = {
    "schemaVersion": "1.1",
    "routes": {"telemetry": {"route": "FROM /messages/* INTO $upstream", "priority": 5, "timeToLiveSecs": 604800}},
}


def service_environment(unit: Path, cache_root: Path) -> dict[str, str]:
    """The variables the systemd ``unit`` sets for the hub (its ``Environment=`` lines, ``%C``, systemd's cache
    root, replaced by ``cache_root``)."""
    env: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        if line.startswith("Environment="):
            name, _, value = line.removeprefix("Environment=").partition("=")
            env[name] = value.replace("%C", str(cache_root))
    return env


def hub_environment(work: Path, *, plain: bool) -> dict[str, str]:
    """This shell's environment, or (``plain`` False) that with the unit's variables, and bytecode written (a
    gateway has no PYTHONDONTWRITEBYTECODE; this machine's shells may)."""
    env = dict(os.environ)
    if not plain:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.update(service_environment(SERVICE_UNIT, work / "cache"))
    return env


def status(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon, RssFile of ``pid`` in MB."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def smaps(pid: int, top: int = 8) -> list[tuple[str, float]]:
    """RSS by mapping name (anonymous mappings as ``[anon]``), largest first, MB."""
    rss: dict[str, float] = defaultdict(float)
    name = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            name = Path(fields[5]).name if len(fields) > 5 else "[anon]"
        elif fields[0] == "Rss:":
            rss[name] += int(fields[1]) / 1024
    return sorted(rss.items(), key=lambda kv: -kv[1])[:top]


def show(label: str, pid: int) -> dict[str, float]:
    s = status(pid)
    parts = ", ".join(f"{n} {mb:.1f}" for n, mb in smaps(pid))
    print(f"{label}: RSS {s['VmRSS']:.1f} MB (anon {s['RssAnon']:.1f}, files {s['RssFile']:.1f}); by mapping: {parts}")
    return s


def device(client_id: str, port: int, cs: ConnectionString, ca: Path | None) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311)
    c.username_pw_set(f"{cs.host_name}/{client_id}/?api-version=2021-04-12", cs.sas_token(int(time.time()) + 86_400))
    if ca is not None:
        c.tls_set(ca_certs=str(ca))
    return c


def first_connection(
    port: int, cs: ConnectionString, ca: Path, proc: subprocess.Popen[str], t0: float, *, timeout_s: float = 120
) -> float:
    """Seconds from ``t0`` to the first CONNACK 0 on ``port`` (tries every 10 ms while the hub starts)."""
    while True:
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"no connection accepted in {timeout_s} s")
        if proc.poll() is not None:
            raise RuntimeError(f"edgehub run exited with {proc.returncode} before accepting a connection")
        if not ca.exists():  # the first start makes it
            time.sleep(0.01)
            continue
        c = device("dev0", port, cs, ca)
        try:
            c.connect("localhost", port, 60)
        except OSError:
            time.sleep(0.01)
            continue
        acked = threading.Event()

        def on_connect(_c: Any, _u: Any, _f: Any, rc: Any, _p: Any, acked: threading.Event = acked) -> None:
            if rc == 0:
                acked.set()

        c.on_connect = on_connect
        c.loop_start()
        if acked.wait(30):
            took = time.perf_counter() - t0
            c.disconnect()
            c.loop_stop()
            return took
        c.loop_stop()
        raise RuntimeError("the hub took a TCP connection but no CONNACK 0 came in 30 s")


def publisher(client_id: str, port: int, cs_text: str, count: int, start: Any, done: Any) -> None:
    c = device(client_id, port, ConnectionString.parse(cs_text), None)
    c.max_inflight_messages_set(INFLIGHT)
    c.max_queued_messages_set(0)
    acked = 0
    finished = threading.Event()

    def on_publish(*_: Any) -> None:
        nonlocal acked
        acked += 1
        if acked == count:
            finished.set()

    c.on_publish = on_publish
    c.connect("127.0.0.1", port, 60)
    c.loop_start()
    start.wait()
    topic = f"devices/{client_id}/messages/events/"
    for _ in range(count):
        while len(c._out_messages) >= INFLIGHT:  # paho walks its whole queue on each ack: keep it short
            time.sleep(0.001)
        c.publish(topic, BODY, qos=1)
    if not finished.wait(1800):
        raise RuntimeError(f"{client_id}: {acked} of {count} acked")
    c.disconnect()
    c.loop_stop()
    done.put(count)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queued", type=int, default=1_000_000)
    ap.add_argument("--devices", type=int, default=10)
    ap.add_argument("--profile", default="pi-zero2w")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--plain", action="store_true", help="this shell's environment, not the systemd unit's")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        data = work / "data"
        manifest = work / "manifest.json"
        manifest.write_text(json.dumps(MANIFEST))
        names = [f"dev{i}" for i in range(args.devices)] + [f"pub{i}" for i in range(PUBLISHERS)]
        creds = {k: ConnectionString.parse(v) for k, v in add_identities(data, names).items()}
        ca = data / "certs" / "ca.pem"
        tls, plain, dead = free_port(), free_port(), free_port()
        cmd = [
            EDGEHUB,
            "run",
            "--profile",
            args.profile,
            "--manifest",
            str(manifest),
            "--data-dir",
            str(data),
            "--mqtts-port",
            str(tls),
            "--mqtt-port",
            str(plain),
            "--amqps-port",
            "0",
            "--admin-port",
            "0",
            "--upstream-mqtt",
            f"127.0.0.1:{dead}",  # nothing listens there: the link is down, the backlog stays in the store
        ]
        # the certificates (and, in the unit's environment, the bytecode cache) are made on the first start only:
        # one start and stop first, so the one measured is
        # the start every later boot makes
        env = hub_environment(work, plain=args.plain)
        warm = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        first_connection(tls, creds["dev0"], ca, warm, time.perf_counter())
        warm.send_signal(signal.SIGTERM)
        warm.wait(60)

        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            startup_s = first_connection(tls, creds["dev0"], ca, proc, t0)
            print(f"start-up to the first accepted connection: {startup_s:.2f} s")
            show("started, nothing connected", proc.pid)
            devices = [device(f"dev{i}", tls, creds[f"dev{i}"], ca) for i in range(args.devices)]
            for c in devices:
                c.connect("localhost", tls, 60)
                c.loop_start()
            time.sleep(QUIET_S)  # a benchmark, not a test: let the connections settle before reading memory
            idle = show(f"{args.devices} devices connected, idle", proc.pid)

            start = mp.Event()
            done: mp.Queue[int] = mp.Queue()
            per = args.queued // PUBLISHERS
            procs = [
                mp.Process(target=publisher, args=(f"pub{i}", plain, creds[f"pub{i}"].format(), per, start, done))
                for i in range(PUBLISHERS)
            ]
            for p in procs:
                p.start()
            t1 = time.perf_counter()
            start.set()
            acked = sum(done.get(timeout=3600) for _ in procs)
            rate = acked / (time.perf_counter() - t1)
            for p in procs:
                p.join(60)
            time.sleep(QUIET_S)
            full = show(f"{acked} messages queued ({rate:.0f} msg/s acked)", proc.pid)
            for c in devices:
                c.disconnect()
                c.loop_stop()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)

        # 4. a restart with the backlog still queued: the store is read in full (checksums) before it listens
        t2 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            restart_s = first_connection(tls, creds["dev0"], ca, proc, t2, timeout_s=900)
            print(f"restart with {acked} queued, to the first accepted connection: {restart_s:.2f} s")
            time.sleep(QUIET_S)
            again = show(f"restarted with {acked} queued", proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    how = "this shell's environment" if args.plain else f"{SERVICE_UNIT.name}'s environment"
    print(
        f"footprint under the {args.profile} profile, in {how}: idle {idle['VmRSS']:.1f} MB with {args.devices} "
        f"devices (target <= 45), {full['VmRSS']:.1f} MB with {acked} queued (target <= 80; peak {full['VmHWM']:.1f}), "
        f"start-up {startup_s:.2f} s (target <= 1.5); restarted with the backlog: {restart_s:.1f} s, "
        f"{again['VmRSS']:.1f} MB (peak {again['VmHWM']:.1f}). Peers on small devices: Azure IoT Edge hub 57-166 MB, "
        "Greengrass stream manager >= 70 MB"
    )
    result = {
        "rss_idle_mb": round(idle["VmRSS"], 1),
        "rss_1m_mb": round(full["VmRSS"], 1),
        "rss_peak_mb": round(full["VmHWM"], 1),
        "startup_s": round(startup_s, 3),
        "queued": acked,
        "restart_s": round(restart_s, 2),
        "rss_restart_mb": round(again["VmRSS"], 1),
        "rss_restart_peak_mb": round(again["VmHWM"], 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
