"""The floor of this design: a bare MQTT QoS 1 relay in Python on the hub's own parts, against Debian's Mosquitto
and the hub itself with the same clients (bench.ingest's telemetry phase), in the same run.

``python -m bench.floor [--publishers 4] [--messages 20000] [--rounds 3]``

The relay (``python -m bench.floor --serve PORT DIR``) does only what any hub built this way must do for each
message: it reads it on uvloop through a BufferedProtocol, writes every read's messages to RocksDB (rocksdict) in
one synced batch on one writer thread (the hub's ``WriterThread``), sends the PUBACKs once that write returned,
forwards each message to its one subscriber as a QoS 1 PUBLISH with up to 64 in flight, and deletes it on that
PUBACK. It has no authentication, routing, message properties, quotas, checkpoints, retries, logging or metrics,
and it trusts what clients send: it is a measuring stick, not a broker.

Reported: CPU microseconds per message (from /proc, as in bench.ingest) of the relay, of Mosquitto and of the hub,
and two ratios: ``floor_ratio`` (relay / Mosquitto: the lowest ratio a Python hub of this design can reach here)
and ``hub_over_floor`` (hub / relay: what the hub's features cost on top of the bare relay). With ``--rounds N``
the three run N times in turn and the JSON gives medians; a ratio is null when a run was too short for /proc
to see CPU time in its denominator (10 ms ticks). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import rocksdict

from bench.ingest import EDGEHUB, MANIFEST, add_identities, free_port, hub_run_args, mosquitto_conf, telemetry
from edgehub.store.group_commit import WriterThread

_WINDOW = 64  # deliveries in flight to the subscriber, as the hub's --module-window in bench.ingest
_PUBACK = b"\x40\x02"


class _Relay:
    """The relay's state: the database, its writer thread, the subscriber and what waits for it."""

    def __init__(self, path: Path) -> None:
        self.db = rocksdict.Rdict(str(path))
        self.synced = rocksdict.WriteOptions()
        self.synced.sync = True
        self.writer = WriterThread("floor-writer")
        self.subscriber: _Client | None = None
        self.waiting: deque[tuple[bytes, bytes, bytes]] = deque()  # (key, topic, payload)
        self.next_key = 0
        self.buffer = bytearray(1 << 16)


class _Client(asyncio.BufferedProtocol):
    def __init__(self, relay: _Relay) -> None:
        self.relay = relay
        self.rest = b""
        self.in_flight: dict[int, bytes] = {}  # packet id -> key, deliveries to this client
        self.next_id = 1
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.relay.buffer)

    def buffer_updated(self, nbytes: int) -> None:
        data = self.rest + bytes(self.relay.buffer[:nbytes])
        end = len(data)
        i = 0
        group: list[tuple[bytes, bytes, bytes]] = []  # (packet id bytes, topic, payload)
        acks: list[int] = []
        transport = self.transport
        assert transport is not None
        while i + 2 <= end:
            kind = data[i] >> 4
            j, length, shift = i + 1, 0, 0
            while j < end:
                b = data[j]
                j += 1
                length |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            else:
                break  # the length is not all here yet
            if j + length > end:
                break
            body = data[j : j + length]
            i = j + length
            if kind == 3:  # PUBLISH, QoS 1
                n = (body[0] << 8) | body[1]
                group.append((body[2 + n : 4 + n], body[2 : 2 + n], body[4 + n :]))
            elif kind == 4:  # PUBACK
                acks.append((body[0] << 8) | body[1])
            elif kind == 1:  # CONNECT
                transport.write(b"\x20\x02\x00\x00")
            elif kind == 8:  # SUBSCRIBE: this client gets every message
                self.relay.subscriber = self
                transport.write(b"\x90\x03" + body[:2] + b"\x01")
            elif kind == 12:  # PINGREQ
                transport.write(b"\xd0\x00")
            elif kind == 14:  # DISCONNECT
                transport.close()
                return
        self.rest = data[i:]
        if group:
            asyncio.get_running_loop().create_task(self._store(group))
        if acks:
            self._acked(acks)

    async def _store(self, group: list[tuple[bytes, bytes, bytes]]) -> None:
        relay = self.relay
        batch = rocksdict.WriteBatch()
        waiting = relay.waiting
        for _, topic, payload in group:
            relay.next_key += 1
            key = relay.next_key.to_bytes(8, "big")
            batch.put(key, payload)
            waiting.append((key, topic, payload))
        await relay.writer.run(lambda: relay.db.write(batch, relay.synced))
        assert self.transport is not None
        self.transport.write(b"".join([_PUBACK + packet_id for packet_id, _, _ in group]))
        if relay.subscriber is not None:
            relay.subscriber._fill()

    def _fill(self) -> None:
        waiting, in_flight = self.relay.waiting, self.in_flight
        out: list[bytes] = []
        while waiting and len(in_flight) < _WINDOW:
            key, topic, payload = waiting.popleft()
            packet_id = self.next_id
            self.next_id = packet_id % 0xFFFF + 1
            in_flight[packet_id] = key
            length = 4 + len(topic) + len(payload)
            header = bytes((0x32, length)) if length < 128 else bytes((0x32, (length & 0x7F) | 0x80, length >> 7))
            out.append(header + len(topic).to_bytes(2, "big") + topic + packet_id.to_bytes(2, "big") + payload)
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def _acked(self, packet_ids: list[int]) -> None:
        relay = self.relay
        batch = rocksdict.WriteBatch()
        for packet_id in packet_ids:
            key = self.in_flight.pop(packet_id, None)
            if key is not None:
                batch.delete(key)
        asyncio.get_running_loop().create_task(relay.writer.run(lambda: relay.db.write(batch)))
        self._fill()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.relay.subscriber is self:
            self.relay.subscriber = None


async def _serve(port: int, path: Path) -> None:
    relay = _Relay(path)
    server = await asyncio.get_running_loop().create_server(lambda: _Client(relay), "127.0.0.1", port)
    print("listening:", flush=True)
    await server.serve_forever()


def _telemetry(cmd: list[str], port: int, args: argparse.Namespace, creds: dict[str, str] | None) -> float:
    """Start the broker, wait until it listens, run the telemetry phase: CPU microseconds per message."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if cmd[0].endswith("mosquitto"):
            time.sleep(0.5)
        else:
            assert proc.stdout is not None
            for line in proc.stdout:
                if "listening:" in line:
                    break
        if creds is None:
            sink, sub = "sink", "devices/+/messages/events/#"
        else:
            sink, sub = "edge/sink", "devices/edge/modules/sink/inputs/#"
        return telemetry(port, proc.pid, creds, args.publishers, args.messages, sink, sub)[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _round(work: Path, args: argparse.Namespace) -> dict[str, float]:
    out: dict[str, float] = {}
    port = free_port()
    out["floor"] = _telemetry(
        [sys.executable, "-m", "bench.floor", "--serve", str(port), str(work / "floor")], port, args, None
    )
    port = free_port()
    conf = mosquitto_conf(work, port)
    out["mosquitto"] = _telemetry(
        [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)], port, args, None
    )
    data, manifest = work / "edgehub", work / "manifest.json"
    manifest.write_text(json.dumps(MANIFEST))
    creds = add_identities(data, [f"pub{i}" for i in range(args.publishers)] + ["edge/sink"])
    port = free_port()
    out["edgehub"] = _telemetry([EDGEHUB, *hub_run_args(manifest, data, port)], port, args, creds)
    print(
        f"CPU us/msg: relay {out['floor']:.1f}, mosquitto {out['mosquitto']:.1f}, edgehub {out['edgehub']:.1f}",
        flush=True,
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--messages", type=int, default=20000, help="per publisher")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve", nargs=2, metavar=("PORT", "DIR"), help="run the relay only")
    args = ap.parse_args()
    if args.serve:
        import uvloop

        uvloop.run(_serve(int(args.serve[0]), Path(args.serve[1])))
        return
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
            rounds.append(_round(Path(tmp), args))

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    def ratio(top: str, bottom: str) -> float | None:
        # /proc counts CPU in 10 ms ticks: a short run can read 0 for a broker, and then there is no ratio to tell
        ratios = [r[top] / r[bottom] for r in rounds if r[bottom]]
        return round(statistics.median(ratios), 2) if ratios else None

    print(
        json.dumps(
            {
                "floor_cpu_us_per_msg": round(median("floor"), 1),
                "mosquitto_cpu_us_per_msg": round(median("mosquitto"), 1),
                "edgehub_cpu_us_per_msg": round(median("edgehub"), 1),
                "floor_ratio": ratio("floor", "mosquitto"),
                "hub_over_floor": ratio("edgehub", "floor"),
                "rounds": args.rounds,
            }
        )
    )


if __name__ == "__main__":
    main()
