"""The ARM64 check, run inside the arm64 root (``hardware/arm64/test-arm64.sh``) by its aarch64 Python.

It starts ``edgehub run`` as a gateway would (the Pi Zero 2 W profile, MQTT and AMQP over TLS on free ports,
``$upstream`` landing as segment files in a folder), makes a device and a module identity, publishes one QoS 1
message over MQTT with paho and waits for its PUBACK and then for the message in the landing folder; then the
module, over AMQP with proton's client (the aarch64 wheel root.sh builds), sends a message to its output, which
a route brings back to its own input, and receives and accepts it there. Then it reads the hub's RSS and stops
the hub with SIGTERM. Every wait is bounded; any failure exits 1 saying which step failed.

The RSS is the hub process's as the kernel sees it: under qemu-user that includes the translator (its code
cache and its own heap), so it is larger than on a real ARM64 board and is no footprint figure
(``python -m bench.footprint`` measures those, natively).

Last line: one JSON object with machine, landed, amqp_round_trip, hub_rss_mb_qemu, startup_s, elapsed_s.
"""

from __future__ import annotations

import json
import os
import platform
import queue
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from proton import Message as AmqpMessage
from proton import SSLDomain
from proton.utils import BlockingConnection

from edgehub.core.sas import ConnectionString
from edgehub.upstream.segment import decode_segment

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deployment" / "examples" / "default.json"
EDGEHUB = [sys.executable, "-c", "from edgehub.runtime.cli import main; main()"]
START_TIMEOUT_S = 240.0  # qemu-user translates every instruction: a start takes tens of seconds there
STEP_TIMEOUT_S = 120.0
BODY = b'{"temperature": 21.5, "from": "arm64"}'
AMQP_BODY = b'{"pressure": 1013, "from": "arm64 over amqp"}'
# the example manifest's routes, and one that brings the AMQP module's output back to its own input
LOOP_ROUTE = "FROM /messages/modules/amqpmod/outputs/out1 INTO BrokeredEndpoint('/modules/amqpmod/inputs/loop')"


def fail(step: str, detail: str) -> None:
    print(f"arm64 check FAILED at {step}: {detail}", flush=True)
    sys.exit(1)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def landed(landing: Path) -> list[bytes]:
    bodies: list[bytes] = []
    for path in sorted(landing.rglob("*.jsonl.gz")):
        bodies.extend(record.body for record in decode_segment(path.read_bytes()))
    return bodies


def identity_add(data: Path, *args: str) -> ConnectionString:
    out = subprocess.run(
        [*EDGEHUB, "identity", "add", *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )
    if out.returncode != 0:
        fail("identity add", out.stderr.strip())
    return ConnectionString.parse(out.stdout.strip())


def amqp_round_trip(port: int, ca: Path, cs: ConnectionString) -> None:
    """The module sends AMQP_BODY to its output out1 and receives it on its input (LOOP_ROUTE), over AMQPS."""
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
    try:
        conn = BlockingConnection(
            f"amqps://localhost:{port}",
            timeout=STEP_TIMEOUT_S,
            ssl_domain=domain,
            sasl_enabled=True,
            allowed_mechs="PLAIN",
            user=f"{cs.device_id}/{cs.module_id}@sas.{cs.host_name}",
            password=cs.sas_token(int(time.time()) + 3600),
        )
    except Exception as exc:  # proton's ConnectionException, Timeout, or an SSL error: each a failed step
        fail("amqp connect", repr(exc))
    try:
        address = f"/devices/{cs.device_id}/modules/{cs.module_id}/messages/events"
        receiver = conn.create_receiver(address, credit=5)
        sender = conn.create_sender(address)
        out = AmqpMessage(body=AMQP_BODY, id="arm64-amqp-1", content_type="application/json")
        out.annotations = {"iothub-outputname": "out1"}
        sender.send(out, timeout=STEP_TIMEOUT_S)  # raises unless the hub accepted it (stored)
        back = receiver.receive(timeout=STEP_TIMEOUT_S)
        if back.body != AMQP_BODY or back.annotations.get("x-opt-input-name") != "loop":
            fail("amqp receive", f"got {back.body!r} with annotations {back.annotations}")
        receiver.accept()
    except Exception as exc:
        fail("amqp round trip", repr(exc))
    finally:
        conn.close()


def main() -> None:
    started = time.monotonic()
    if platform.machine() != "aarch64":
        fail("platform", f"this Python runs as {platform.machine()}, not aarch64")
    tmp = Path(tempfile.mkdtemp(prefix="edgehub-arm64-"))
    data, landing, manifest = tmp / "data", tmp / "landing", tmp / "manifest.json"
    document = json.loads(MANIFEST.read_text())
    document["modulesContent"]["$edgeHub"]["properties.desired"]["routes"]["loop"] = LOOP_ROUTE
    manifest.write_text(json.dumps(document))
    cs = identity_add(data, "dev1")
    module_cs = identity_add(data, "edge", "--module", "amqpmod")

    hub_started = time.monotonic()
    hub = subprocess.Popen(
        [
            *EDGEHUB,
            "run",
            "--manifest",
            str(manifest),
            "--data-dir",
            str(data),
            "--mqtts-port",
            "0",
            "--admin-port",
            "0",  # a free port: a hub the user left running holds the default (9600)
            "--amqps-port",
            "0",
            "--profile",
            "pi-zero2w",
            "--upstream-upload",
            landing.as_uri(),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert hub.stdout is not None
        port = amqps_port = 0
        lines: list[str] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port:
            if time.monotonic() > deadline:
                fail("start", "the hub did not listen in time")
            line = hub.stdout.readline()
            if not line:
                fail("start", "edgehub run ended: " + " | ".join(lines[-10:]))
            lines.append(line.rstrip())
            m = re.search(r"listening: tls 127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else 0
            m = re.search(r"amqps 127\.0\.0\.1:(\d+)", line)
            amqps_port = int(m.group(1)) if m else 0
        if not amqps_port:
            fail("start", f"no AMQPS listener in {lines[-1]!r}")
        startup_s = time.monotonic() - hub_started

        acks: queue.Queue[int] = queue.Queue()
        connected: queue.Queue[int] = queue.Queue()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="dev1", protocol=mqtt.MQTTv311)
        client.on_connect = lambda _c, _u, _f, rc, _p: connected.put(rc.value)
        client.on_publish = lambda _c, _u, mid, _rc, _p: acks.put(mid)
        client.username_pw_set(f"{cs.host_name}/dev1/?api-version=2021-04-12", cs.sas_token(int(time.time()) + 3600))
        client.tls_set(ca_certs=str(data / "certs" / "ca.pem"))
        client.connect("localhost", port)
        client.loop_start()
        try:
            rc = connected.get(timeout=STEP_TIMEOUT_S)
            if rc != 0:
                fail("connect", f"CONNACK {rc}")
            mid = client.publish("devices/dev1/messages/events/", BODY, qos=1).mid
            if acks.get(timeout=STEP_TIMEOUT_S) != mid:
                fail("publish", "a PUBACK for another packet id")
            deadline = time.monotonic() + STEP_TIMEOUT_S
            while BODY not in landed(landing):
                if time.monotonic() > deadline:
                    fail("landing", f"the message did not land in {landing}")
                time.sleep(0.2)  # polling a folder: there is no event to wait on
            amqp_round_trip(amqps_port, data / "certs" / "ca.pem", module_cs)
            rss = rss_mb(hub.pid)
        finally:
            client.disconnect()
            client.loop_stop()
        hub.send_signal(signal.SIGTERM)
        rest, _ = hub.communicate(timeout=STEP_TIMEOUT_S)
        if hub.returncode != 0 or "stopped" not in rest:
            fail("stop", f"exit {hub.returncode}: {rest[-500:]}")
    finally:
        if hub.poll() is None:
            hub.kill()
            hub.wait()
    print(
        f"arm64: the hub ran as {platform.machine()} (Python {platform.python_version()}), a device published over "
        f"MQTT/TLS, the message landed in {landing}, a module's AMQPS message came back to it through a route; "
        f"hub RSS {rss:.1f} MB under qemu-user (translator included)"
    )
    result = {
        "machine": platform.machine(),
        "landed": True,
        "amqp_round_trip": True,
        "hub_rss_mb_qemu": round(rss, 1),
        "startup_s": round(startup_s, 2),
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)
    os.sync()


if __name__ == "__main__":
    main()
