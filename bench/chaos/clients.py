"""The chaos run's devices and modules: paho MQTT clients that live through hub kills.

Each client runs on its own thread with its own paho loop (``Client.loop``, never ``loop_start``: paho's own
thread reconnects behind our back and re-sends on its own schedule). When the connection goes, the client is
dropped and a new one connects to wherever the hub listens now (``port_of()``), as a device would.

``MqttDevice`` publishes QoS 1 telemetry at a steady rate in bursts, each message numbered per device (``seq``
from 1) and carrying its class (``cls``) as application properties and its ``$.mid`` (``{device}-{seq}``), at most
``window`` unacknowledged. A message stays pending until its PUBACK; after a reconnect every pending message is
sent again, in number order, before anything new, with the same ``$.mid`` (the hub's duplicate detection drops
the re-send of what it had already stored). ``acked`` records each message's first send and its ack.

``ModuleConsumer`` connects as a module and counts what arrives on its inputs per ``(device, seq)``, and keeps
the order of first arrivals; paho acks each after its callback returned.

The seam for other protocols (AMQP, when its head lands): a publisher is anything with ``name``,
``start()``, ``stop_publishing()``, ``join(timeout)``, ``pending()`` and ``acked()`` (``Publisher``); the
run mixes them freely and the verifier sees only ``Acked`` records.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from bench.chaos.verify import Acked

__all__ = ["ModuleConsumer", "MqttDevice", "Publisher"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
RETRY_S = 0.2  # between connection attempts while the hub is down
PAD = "x" * 120  # bodies of about 200 bytes, like telemetry
HOST_NAME = "localhost"  # the hub's default IoT Hub host name, the first part of a user name


class Publisher(Protocol):
    """A device of the run, whatever its protocol: publishes until told to stop, re-sends until acked."""

    name: str
    connections: int
    resent: int

    def start(self) -> None: ...

    def stop_publishing(self) -> None: ...

    def abort(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def pending(self) -> int: ...

    def acked(self) -> list[Acked]: ...


class _Link:
    """One paho connection: connect, wait for the CONNACK, then ``loop`` until it ends."""

    def __init__(self, client_id: str, password: str, port: int, on_message: Callable[[Any], None] | None) -> None:
        self.client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=True
        )
        self.client.username_pw_set(f"{HOST_NAME}/{client_id}/?api-version=2021-04-12", password)
        self.client.max_inflight_messages_set(1000)  # the owner keeps its own window
        self.client.max_queued_messages_set(0)
        self.connected = False
        self.refused = False
        self.acks: list[int] = []
        self.client.on_connect = self._on_connect
        self.client.on_publish = lambda c, u, mid, rc, props: self.acks.append(mid)
        if on_message is not None:
            self.client.on_message = lambda c, u, msg: on_message(msg)
        self.port = port

    def _on_connect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        if rc == 0:
            self.connected = True
        else:
            self.refused = True

    def open(self) -> bool:
        """Connect and wait for a CONNACK that accepts; False (and closed) otherwise."""
        try:
            self.client.connect("127.0.0.1", self.port, keepalive=10)
        except OSError:
            return False
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while not self.connected:
            if self.refused or time.monotonic() > deadline or self.client.loop(timeout=0.05) != paho.MQTT_ERR_SUCCESS:
                self.close()
                return False
        return True

    def pump(self, timeout_s: float) -> bool:
        """One turn of paho's loop; False once the connection is gone."""
        return self.client.loop(timeout=timeout_s) == paho.MQTT_ERR_SUCCESS

    def close(self) -> None:
        try:
            self.client.disconnect()
        except OSError:
            pass
        sock = self.client.socket()
        if sock is not None:
            sock.close()


class MqttDevice:
    """A device publishing ``rate_hz`` numbered QoS 1 messages a second, classes drawn from ``classes``, in bursts
    of ``burst`` on a grid of ``time.monotonic()`` (every ``burst / rate_hz`` seconds), so that a run can aim a
    kill just after a burst, while the hub is writing it (``bench.chaos.run``)."""

    def __init__(
        self,
        name: str,
        password: str,
        port_of: Callable[[], int | None],
        *,
        rate_hz: float,
        classes: list[tuple[str, float]],
        seed: int,
        burst: int = 1,
        window: int = 20,
    ) -> None:
        self.name = name
        self._thread = threading.Thread(target=self._main, name=f"chaos.device.{name}", daemon=True)
        self._password = password
        self._port_of = port_of
        self._burst = burst
        self._tick_s = burst / rate_hz
        self._classes = classes
        self._rnd = random.Random(seed)
        self._window = window
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[str, bytes]] = {}  # seq -> (topic, payload), until acked
        self._first_sent: dict[int, float] = {}
        self._cls: dict[int, str] = {}
        self._acked: list[Acked] = []
        self._publishing = True
        self._abort = threading.Event()
        self._seq = 0
        self.connections = 0
        self.resent = 0  # messages sent again after a reconnect, for want of their PUBACK

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def stop_publishing(self) -> None:
        """Publish nothing new; keep re-sending what is pending until it is acked or ``abort``."""
        self._publishing = False

    def abort(self) -> None:
        self._abort.set()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def acked(self) -> list[Acked]:
        with self._lock:
            return list(self._acked)

    def _next_message(self) -> tuple[int, str, bytes]:
        self._seq += 1
        seq = self._seq
        r, cls = self._rnd.random(), self._classes[-1][0]
        for name, share in self._classes:
            if r < share:
                cls = name
                break
            r -= share
        topic = f"devices/{self.name}/messages/events/$.mid={self.name}-{seq}&cls={cls}&seq={seq}"
        body = json.dumps({"device": self.name, "seq": seq, "cls": cls, "t": time.time(), "pad": PAD}).encode()
        self._cls[seq] = cls
        return seq, topic, body

    def _main(self) -> None:
        try:
            self._run()
        except Exception:  # a device that dies says so; the run reports its pending as unacknowledged
            log.exception("chaos.device_failed device=%s", self.name)

    def _run(self) -> None:
        while not self._abort.is_set():
            if not self._publishing and not self.pending():
                return
            port = self._port_of()
            link = _Link(self.name, self._password, port, None) if port is not None else None
            if link is None or not link.open():
                self._abort.wait(RETRY_S)
                continue
            self.connections += 1
            mids: dict[int, int] = {}
            with self._lock:
                resend = sorted(self._pending.items())
            for seq, (topic, body) in resend:
                mids[link.client.publish(topic, body, qos=1).mid] = seq
            self.resent += len(resend)
            next_tick = math.ceil(time.monotonic() / self._tick_s) * self._tick_s
            while not self._abort.is_set():
                now = time.monotonic()
                if self._publishing and now >= next_tick:
                    for _ in range(self._burst):
                        if self.pending() >= self._window:
                            break  # what does not fit is not sent later: no catching up after a stall
                        seq, topic, body = self._next_message()
                        with self._lock:
                            self._pending[seq] = (topic, body)
                            self._first_sent[seq] = time.time()
                        mids[link.client.publish(topic, body, qos=1).mid] = seq
                    next_tick = (math.floor(now / self._tick_s) + 1) * self._tick_s
                alive = link.pump(0.005)
                if link.acks:
                    at = time.time()
                    with self._lock:
                        for mid in link.acks:
                            seq = mids.pop(mid, -1)
                            if self._pending.pop(seq, None) is not None:
                                self._acked.append(Acked(self.name, seq, self._cls[seq], self._first_sent[seq], at))
                    link.acks.clear()
                if not alive:
                    break
                if not self._publishing and not self.pending():
                    link.close()
                    return
            link.close()


class ModuleConsumer:
    """A module (``device/module``) counting what arrives on its inputs, per ``(device, seq)``."""

    def __init__(self, identity: str, password: str, port_of: Callable[[], int | None]) -> None:
        self.identity = identity
        self._thread = threading.Thread(target=self._main, name=f"chaos.module.{identity}", daemon=True)
        self._password = password
        self._port_of = port_of
        self._lock = threading.Lock()
        self._received: dict[tuple[str, int], int] = {}
        self._first_arrivals: list[tuple[str, int]] = []
        self._halt = threading.Event()
        self.connections = 0

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def received(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return dict(self._received)

    def first_arrivals(self) -> list[tuple[str, int]]:
        """Each ``(device, seq)`` once, in the order it first arrived."""
        with self._lock:
            return list(self._first_arrivals)

    def stop(self) -> None:
        self._halt.set()

    def _on_message(self, msg: Any) -> None:
        body = json.loads(msg.payload)
        key = (str(body["device"]), int(body["seq"]))
        with self._lock:
            n = self._received[key] = self._received.get(key, 0) + 1
            if n == 1:
                self._first_arrivals.append(key)

    def _main(self) -> None:
        try:
            while not self._halt.is_set():
                port = self._port_of()
                link = _Link(self.identity, self._password, port, self._on_message) if port is not None else None
                if link is None or not link.open():
                    self._halt.wait(RETRY_S)
                    continue
                self.connections += 1
                while not self._halt.is_set() and link.pump(0.05):
                    pass
                link.close()
        except Exception:
            log.exception("chaos.module_failed module=%s", self.identity)
