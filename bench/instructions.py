"""Instructions per message of the hub and of Debian's Mosquitto under callgrind: bench.ingest's telemetry phase
with a figure that does not move with the machine.

``python -m bench.instructions [--publishers 4] [--messages 1000] [--keep DIR]``

CPU time per message (bench.ingest) moves by 10 to 25 % between runs on a shared machine, more than most single
changes to the hub; an instruction count is the same to within ~0.3 % run after run. Each broker runs under
``valgrind --tool=callgrind`` (Debian's valgrind); ``--publishers`` paho processes each send ``--messages`` QoS 1
200-byte telemetry messages, routed (edgehub) or subscribed (Mosquitto) to one receiver, as in bench.ingest.
The counters are zeroed once every client is connected and dumped once the receiver has everything and the hub
has run a cleanup (``callgrind_control``), so start-up is not counted. Reported: instructions (Ir) per
message for both, all threads, user space only (the kernel's share, sockets and fsync, is not in it), and
their ratio.

Under valgrind a broker runs ~50x slower, so it is saturated: reads and groups are larger than in bench.ingest
and per-read costs weigh less. Use it to compare two versions of the hub (or the hub with Mosquitto) on the
same work, not as a time. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import getpass
import json
import multiprocessing as mp
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.ingest import (
    EDGEHUB,
    MANIFEST,
    Sink,
    add_identities,
    free_port,
    hub_run_args,
    mosquitto_conf,
    publisher,
)
from edgehub.core.sas import ConnectionString

SETTLE_S = 1.5  # after the last receipt: the hub's cleanup (every 0.5 s here) runs inside the count


def _valgrind(out: Path, *cmd: str) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", *cmd]


def _count(pid: int, out: Path, port: int, creds: dict[str, str] | None, args: argparse.Namespace, sub: str) -> float:
    """Zero the counters once the clients are connected, run the phase, dump: instructions per message."""
    sink_id = "edge/sink" if creds else "sink"
    sink = Sink(
        sink_id, port, ConnectionString.parse(creds[sink_id]) if creds else None, sub, args.publishers * args.messages
    )
    start = mp.Event()
    procs = []
    for i in range(args.publishers):
        topic = f"devices/pub{i}/messages/events/"
        cs = creds[f"pub{i}"] if creds else None
        procs.append(mp.Process(target=publisher, args=(f"pub{i}", port, cs, topic, args.messages, start)))
    for p in procs:
        p.start()
    time.sleep(3.0)  # every publisher connected (slowly, under valgrind)
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    start.set()
    ok = sink.done.wait(900)
    time.sleep(SETTLE_S)
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    for p in procs:
        p.join(60)
    sink.close()
    if not ok:
        raise RuntimeError(f"only {sink.count} of {sink.expect} messages arrived")
    for f in out.parent.glob(f"{out.name}.*"):
        text = f.read_text(errors="replace")
        if "Trigger: dump" in text:
            m = re.search(r"^summary:\s+(\d+)", text, re.M)
            if m:
                return float(int(m.group(1)) / (args.publishers * args.messages))
    raise RuntimeError("callgrind wrote no dump")


def run_edgehub(work: Path, args: argparse.Namespace) -> float:
    data = work / "edgehub"
    manifest = work / "manifest.json"
    manifest.write_text(json.dumps(MANIFEST))
    creds = add_identities(data, [f"pub{i}" for i in range(args.publishers)] + ["edge/sink"])
    port = free_port()
    cmd = [sys.executable, EDGEHUB, *hub_run_args(manifest, data, port), "--event-loop", args.event_loop]
    proc = subprocess.Popen(
        _valgrind(work / "hub.cg", *cmd), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "listening:" in line:
                break
        return _count(proc.pid, work / "hub.cg", port, creds, args, "devices/edge/modules/sink/inputs/#")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


def run_mosquitto(work: Path, args: argparse.Namespace) -> float:
    port = free_port()
    # No privilege drop: callgrind_control talks to the process it started, as the same user.
    conf = mosquitto_conf(work, port, f"user {getpass.getuser()}")
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = subprocess.Popen(_valgrind(work / "mosq.cg", mosquitto, "-c", str(conf)), stderr=subprocess.DEVNULL)
    try:
        time.sleep(3.0)  # started under valgrind
        return _count(proc.pid, work / "mosq.cg", port, None, args, "devices/+/messages/events/#")
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--messages", type=int, default=1000, help="per publisher")
    ap.add_argument(
        "--keep", type=Path, default=None, help="a directory to leave the callgrind files in, for callgrind_annotate"
    )
    ap.add_argument(
        "--event-loop", choices=["uvloop", "asyncio"], default="uvloop", help="the hub's event loop (edgehub run's)"
    )
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("bench.instructions needs valgrind: apt-get install valgrind")
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        work = Path(tmp)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            work = args.keep
        mosq = run_mosquitto(work, args)
        print(f"mosquitto: {mosq:,.0f} instructions per message (broker, user space)")
        edge = run_edgehub(work, args)
        print(f"edgehub:   {edge:,.0f} instructions per message (hub, user space, all threads)")
    print(
        json.dumps(
            {
                "edgehub_ir_per_msg": round(edge),
                "mosquitto_ir_per_msg": round(mosq),
                "ir_ratio": round(edge / mosq, 2),
                "messages": args.publishers * args.messages,
            }
        )
    )


if __name__ == "__main__":
    main()
