"""The ingest workload over AMQP 1.0: edgehub's AMQP head beside its MQTT head, and RabbitMQ's AMQP 1.0 plugin.

``python -m bench.ingest --protocol amqp [--publishers 4] [--messages 20000] [--rounds 1]``

1. edgehub over AMQP: ``--publishers`` processes, each a proton client (its reactor, in the client only), send
   ``--messages`` 200-byte messages unsettled (at most ``WINDOW`` awaiting their outcome, as the MQTT run's 64
   QoS 1 in flight) to ``/devices/pub{i}/messages/events`` on the hub's plain AMQP port (SASL PLAIN, SAS token);
   a route sends them to a module, the MQTT sink of ``bench.ingest`` (the same delivery side as the MQTT run).
2. edgehub over MQTT: ``bench.ingest``'s telemetry phase against the same hub, the same sink.
3. RabbitMQ 3.10 (Debian's), ``rabbitmq_amqp1_0``: the same publishers send durable messages to a durable queue
   (``/queue/bench``: settled once written), one proton receiver drains it.
Reported per broker: msgs/s (first send to last receipt) and the broker's CPU per message (``SETTLE_S`` after the
last receipt). Last line: JSON with ``amqp_msgs_per_s``, ``amqp_cpu_us_per_msg``, ``mqtt_cpu_us_per_msg``,
``rabbitmq_msgs_per_s``, ``rabbitmq_cpu_us_per_msg`` and ``amqp_to_mqtt_cpu_ratio`` (medians over ``--rounds``).

``--message-ids``: each AMQP message carries a message id of its own (``pub{i}-{n}``), so no two transfers share
their sections and the head decodes every one in full (``protocol_heads/amqp/transfers.py`` reuses the mapping of
sections it has just seen, as the MQTT head reuses a known topic's; without ids the bench's messages repeat). The
MQTT run is unchanged: its topics still repeat, so this ratio is the conservative one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from bench import rabbitmq
from bench.ingest import (
    BODY,
    EDGEHUB,
    MANIFEST,
    SETTLE_S,
    Sink,
    add_identities,
    cpu_s,
    free_port,
    hub_run_args,
    telemetry,
)
from edgehub.core.sas import ConnectionString

WINDOW = 64


class _Publisher(MessagingHandler):  # type: ignore[misc]
    def __init__(
        self, url: str, address: str, count: int, user: str, password: str, start: Any, ids: bool = False
    ) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.url, self.address, self.count, self.ids = url, address, count, ids
        self.user, self.password, self.start = user, password, start
        self.sent = self.accepted = self.refused = 0
        self.waited = False

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(
            self.url,
            user=self.user,
            password=self.password,
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            sasl_enabled=True,
        )
        event.container.create_sender(conn, self.address)

    def on_sendable(self, event: Any) -> None:
        if not self.waited:
            self.start.wait()  # connected and attached: the measured window starts here
            self.waited = True
        self._send(event.sender)

    def _send(self, sender: Any) -> None:
        while sender.credit > 0 and self.sent < self.count and self.sent - self.accepted - self.refused < WINDOW:
            mid = f"{self.user.split('@')[0]}-{self.sent}" if self.ids else None
            sender.send(Message(body=BODY, durable=True, id=mid))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        self._settled(event)

    def on_rejected(self, event: Any) -> None:
        self.refused += 1
        self._settled(event)

    def _settled(self, event: Any) -> None:
        if self.accepted + self.refused >= self.count:
            event.connection.close()
        else:
            self._send(event.sender)


def publisher(url: str, address: str, count: int, user: str, password: str, start: Any, ids: bool = False) -> None:
    handler = _Publisher(url, address, count, user, password, start, ids)
    Container(handler).run()
    if handler.refused:
        raise SystemExit(f"{handler.refused} of {count} messages refused")


class _Drain(MessagingHandler):  # type: ignore[misc]
    def __init__(self, url: str, address: str, expect: int, done: Any, last: Any) -> None:
        super().__init__(prefetch=256)
        self.url, self.address, self.expect, self.done, self.last = url, address, expect, done, last
        self.count = 0

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(
            self.url, user="guest", password="guest", allowed_mechs="PLAIN", allow_insecure_mechs=True
        )
        event.container.create_receiver(conn, self.address)

    def on_message(self, event: Any) -> None:
        self.count += 1
        if self.count >= self.expect:
            self.last.value = time.perf_counter()
            self.done.set()
            event.connection.close()


def drain(url: str, address: str, expect: int, done: Any, last: Any) -> None:
    Container(_Drain(url, address, expect, done, last)).run()


def amqp_telemetry(
    url: str, users: list[tuple[str, str, str]], n_msg: int, cpu: Any, wait_done: Any, ids: bool = False
) -> tuple[float, float]:
    """Publishers (address, user, password) each send ``n_msg``; ``wait_done()`` returns the last receipt's
    ``perf_counter`` once all arrived. Returns msgs/s and CPU us/msg of the broker (``cpu()``)."""
    start = mp.Event()
    procs = [mp.Process(target=publisher, args=(url, a, n_msg, u, p, start, ids)) for a, u, p in users]
    for p in procs:
        p.start()
    time.sleep(1.5)  # let every publisher connect and attach (outside the measured window)
    cpu0, t0 = cpu(), time.perf_counter()
    start.set()
    t1 = wait_done()
    time.sleep(SETTLE_S)
    cpu1 = cpu()
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"an AMQP publisher failed ({p.exitcode})")
    total = len(users) * n_msg
    return total / (t1 - t0), (cpu1 - cpu0) / total * 1e6


def run_edgehub(work: Path, args: argparse.Namespace) -> dict[str, float]:
    data, manifest = work / "edgehub", work / "manifest.json"
    manifest.write_text(json.dumps(MANIFEST))
    creds = add_identities(data, [f"pub{i}" for i in range(args.publishers)] + ["edge/sink"])
    mqtt_port, amqp_port = free_port(), free_port()
    # The admin API on a free port: its default (9600) may be another hub's on a shared machine, and then the
    # run ends before it listens.
    cmd = [EDGEHUB, *hub_run_args(manifest, data, mqtt_port), "--amqp-port", str(amqp_port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if re.search(r"listening:", line):
                break
        total = args.publishers * args.messages
        sink = Sink(
            "edge/sink", mqtt_port, ConnectionString.parse(creds["edge/sink"]), "devices/edge/+/+/inputs/#", total
        )
        users = []
        for i in range(args.publishers):
            cs = ConnectionString.parse(creds[f"pub{i}"])
            users.append(
                (
                    f"/devices/pub{i}/messages/events",
                    f"pub{i}@sas.{cs.host_name}",
                    cs.sas_token(int(time.time()) + 3600),
                )
            )

        def wait_done() -> float:
            if not sink.done.wait(240):
                raise RuntimeError(f"only {sink.count} of {total} arrived")
            return sink.last

        # EDGEHUB_BENCH_PYSPY=FILE: py-spy samples the hub through the AMQP phase (collapsed stacks to FILE).
        spy = None
        if os.environ.get("EDGEHUB_BENCH_PYSPY"):
            spy_cmd = ["record", "-r", "250", "-f", "raw", "-o", os.environ["EDGEHUB_BENCH_PYSPY"], "--pid"]
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), *spy_cmd, str(proc.pid)])
        rate, cpu = amqp_telemetry(
            f"amqp://127.0.0.1:{amqp_port}", users, args.messages, lambda: cpu_s(proc.pid), wait_done, args.message_ids
        )
        sink.close()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        m_rate, m_cpu = telemetry(
            mqtt_port,
            proc.pid,
            creds,
            args.publishers,
            args.messages,
            "edge/sink",
            "devices/edge/modules/sink/inputs/#",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return {"amqp_rate": rate, "amqp_cpu": cpu, "mqtt_rate": m_rate, "mqtt_cpu": m_cpu}


def run_rabbitmq(work: Path, args: argparse.Namespace) -> dict[str, float]:
    with rabbitmq.RabbitMq(work) as rmq:
        url = f"amqp://127.0.0.1:{rmq.amqp_port}"
        total = args.publishers * args.messages
        done, last = mp.Event(), mp.Value("d", 0.0)
        sink = mp.Process(target=drain, args=(url, "/queue/bench", total, done, last))
        sink.start()
        users = [("/queue/bench", "guest", "guest")] * args.publishers

        def wait_done() -> float:
            if not done.wait(300):
                raise RuntimeError("RabbitMQ: not every message arrived")
            return float(last.value)

        rate, cpu = amqp_telemetry(url, users, args.messages, rmq.cpu_s, wait_done, args.message_ids)
        sink.join(30)
    return {"rate": rate, "cpu": cpu}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocol", choices=["amqp"], default="amqp")
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--messages", type=int, default=20000, help="per publisher")
    ap.add_argument("--m2m", type=int, default=0, help="(the MQTT run's; not used here)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--message-ids", action="store_true", help="a message id per AMQP message (see above)")
    args = ap.parse_args(argv)
    edges: list[dict[str, float]] = []
    rabbits: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ingest-amqp-") as tmp:
        for n in range(args.rounds):
            work = Path(tmp) / f"round{n}"
            work.mkdir()
            if rabbitmq.available():
                rabbit = run_rabbitmq(work, args)
                print(
                    f"rabbitmq (amqp 1.0, durable queue): {rabbit['rate']:.0f} msgs/s, {rabbit['cpu']:.1f} CPU us/msg"
                )
                rabbits.append(rabbit)
            edge = run_edgehub(work, args)
            print(f"edgehub over amqp: {edge['amqp_rate']:.0f} msgs/s end to end, {edge['amqp_cpu']:.1f} CPU us/msg")
            print(f"edgehub over mqtt: {edge['mqtt_rate']:.0f} msgs/s end to end, {edge['mqtt_cpu']:.1f} CPU us/msg")
            edges.append(edge)
    if not rabbits:
        print("rabbitmq: not installed (apt install rabbitmq-server): its figures are null")

    def median(rows: list[dict[str, float]], key: str) -> float | None:
        return round(statistics.median(r[key] for r in rows), 1) if rows else None

    ratios = [e["amqp_cpu"] / e["mqtt_cpu"] for e in edges if e["mqtt_cpu"]]
    print(
        json.dumps(
            {
                "amqp_msgs_per_s": median(edges, "amqp_rate"),
                "amqp_cpu_us_per_msg": median(edges, "amqp_cpu"),
                "mqtt_msgs_per_s": median(edges, "mqtt_rate"),
                "mqtt_cpu_us_per_msg": median(edges, "mqtt_cpu"),
                "amqp_to_mqtt_cpu_ratio": round(statistics.median(ratios), 2) if ratios else None,
                "rabbitmq_msgs_per_s": median(rabbits, "rate"),
                "rabbitmq_cpu_us_per_msg": median(rabbits, "cpu"),
                "rounds": args.rounds,
                "message_ids": args.message_ids,
            }
        )
    )
