"""The MQTT head alone (codec, state machine, adapter, IoT Hub mapping) against Debian's Mosquitto, same clients.

Usage: python -m bench.mqtt_head [--messages N] [--publishers P]

P paho publisher processes each send N QoS 1 messages of 200 bytes (up to 100 in flight) to IoT Hub telemetry
topics; the broker is either the edgehub head backed by the in-memory hub (no routing, no disk: this measures
the head, not the store) in its own process, or Mosquitto (persistence off, so both keep messages in memory).
Reported: messages/s end to end (until the last PUBACK) and CPU microseconds per message of the broker process
(from /proc via psutil). A run in which a message is not acknowledged fails. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.enums import CallbackAPIVersion

HOST = "bench.local"
PAYLOAD = b"x" * 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _key(device: str) -> str:
    return base64.b64encode(f"bench key {device}".encode()).decode()


def _serve_head(port: int, devices: list[str], ready: mp.synchronize.Event) -> None:
    from edgehub.core import Identity
    from edgehub.testing import InMemoryHub
    from protocol_heads.mqtt.server import MqttServer, MqttSettings

    async def main() -> None:
        hub = InMemoryHub(host_name=HOST)
        for d in devices:
            hub.add_identity(Identity.parse(d), key_b64=_key(d))
        settings = MqttSettings(tcp_port=port, tls_port=None)
        async with MqttServer(hub, settings=settings):
            ready.set()
            await asyncio.Event().wait()

    asyncio.run(main())


def _publish(port: int, device: str, count: int, sas: bool, out: mp.Queue[int]) -> None:
    from edgehub.core.sas import generate_sas_token

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device, protocol=mqtt.MQTTv311)
    client.max_inflight_messages_set(100)
    client.max_queued_messages_set(0)
    if sas:
        token = generate_sas_token(f"{HOST}/devices/{device}", _key(device), int(time.time()) + 3600)
        client.username_pw_set(f"{HOST}/{device}/?api-version=2021-04-12", token)
    done = mp.Event()
    acked = [0]

    def on_publish(c: mqtt.Client, u: object, mid: int, rc: object, props: object) -> None:
        acked[0] += 1
        if acked[0] == count:
            done.set()

    client.on_publish = on_publish
    client.connect("127.0.0.1", port)
    sock = client.socket()
    if isinstance(sock, socket.socket):
        # Same for both brokers: without it, Nagle on the client meets delayed ACKs on the broker side.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client.loop_start()
    topic = f"devices/{device}/messages/events/$.ct=application%2Fjson"
    for _ in range(count):
        client.publish(topic, PAYLOAD, qos=1)
    done.wait(300)
    out.put(acked[0])
    client.disconnect()
    client.loop_stop()


def _run_clients(port: int, devices: list[str], count: int, sas: bool, broker_pid: int) -> tuple[float, float]:
    proc = psutil.Process(broker_pid)
    cpu0 = sum(proc.cpu_times()[:2])
    out: mp.Queue[int] = mp.Queue()
    t0 = time.perf_counter()
    workers = [mp.Process(target=_publish, args=(port, d, count, sas, out)) for d in devices]
    for w in workers:
        w.start()
    acked = sum(out.get(timeout=600) for _ in workers)
    for w in workers:
        w.join(600)
    elapsed = time.perf_counter() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    total = count * len(devices)
    if acked != total:
        raise RuntimeError(f"only {acked} of {total} messages were acknowledged (port {port})")
    return total / elapsed, cpu / total * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=20_000, help="messages per publisher")
    parser.add_argument("--publishers", type=int, default=2)
    args = parser.parse_args(argv)
    devices = [f"bench{i}" for i in range(args.publishers)]

    port = _free_port()
    ready = mp.Event()
    head = mp.Process(target=_serve_head, args=(port, devices, ready), daemon=True)
    head.start()
    if not ready.wait(30):
        print("head did not start", file=sys.stderr)
        return 1
    assert head.pid is not None
    try:
        head_rate, head_cpu = _run_clients(port, devices, args.messages, True, head.pid)
    finally:
        head.terminate()
        head.join()
    print(f"edgehub head : {head_rate:10.0f} msg/s  {head_cpu:7.1f} us CPU/msg")

    mport = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(
            f"listener {mport} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_inflight_messages 100\n"
        )
        mosq = subprocess.Popen(["mosquitto", "-c", str(conf)], stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", mport), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            mosq_rate, mosq_cpu = _run_clients(mport, devices, args.messages, False, mosq.pid)
        finally:
            mosq.terminate()
            mosq.wait()
    print(f"mosquitto    : {mosq_rate:10.0f} msg/s  {mosq_cpu:7.1f} us CPU/msg")
    result = {
        "publishers": args.publishers,
        "messages": args.messages * args.publishers,
        "edgehub_head_msgs_per_s": round(head_rate),
        "mosquitto_msgs_per_s": round(mosq_rate),
        "edgehub_head_cpu_us_per_msg": round(head_cpu, 1),
        "mosquitto_cpu_us_per_msg": round(mosq_cpu, 1),
        "cpu_ratio": round(head_cpu / mosq_cpu, 2) if mosq_cpu else None,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
