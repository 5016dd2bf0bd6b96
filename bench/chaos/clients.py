"""The chaos run's devices and modules: paho MQTT and proton AMQP clients that live through hub kills.

Each client runs on its own thread with its own paho loop (``Client.loop``, never ``loop_start``: paho's own
thread reconnects behind our back and re-sends on its own schedule) or its own proton ``Container`` per
connection. When the connection goes, the client is dropped and a new one connects to wherever the hub listens
now (``port_of()``), as a device would.

``MqttDevice`` publishes QoS 1 telemetry at a steady rate in bursts, each message numbered per device (``seq``
from 1) and carrying its class (``cls``) as application properties and its ``$.mid`` (``{device}-{seq}``), at most
``window`` unacknowledged. A message stays pending until its PUBACK; after a reconnect every pending message is
sent again, in number order, before anything new, with the same ``$.mid`` (the hub's duplicate detection drops
the re-send of what it had already stored). ``acked`` records each message's first send and its ack.
``AmqpDevice`` is the same device over AMQP 1.0: the ``message-id`` is the ``$.mid``, ``accepted`` the PUBACK.

``ModuleConsumer`` connects as a module and counts what arrives on its inputs per ``(device, seq)``, and keeps
the order of first arrivals; paho acks each after its callback returned. ``CommandDevice`` counts the
cloud-to-device messages it gets. Both answer direct method calls (``answer_method``) and record when they were
connected.

A publisher is anything with ``name``, ``start()``, ``stop_publishing()``, ``join(timeout)``, ``pending()`` and
``acked()`` (``Publisher``); the run mixes them freely and the verifier sees only ``Acked`` records.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from bench.chaos.verify import Acked

__all__ = ["AmqpDevice", "CommandDevice", "ModuleConsumer", "MqttDevice", "Publisher", "answer_method"]

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
    refused: int

    def start(self) -> None: ...

    def stop_publishing(self) -> None: ...

    def abort(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def pending(self) -> int: ...

    def acked(self) -> list[Acked]: ...


class _Link:
    """One paho connection: connect, wait for the CONNACK, then ``loop`` until it ends."""

    def __init__(
        self,
        client_id: str,
        password: str,
        port: int,
        on_message: Callable[[_Link, Any], None] | None,
        subscriptions: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=True
        )
        self.client.username_pw_set(f"{HOST_NAME}/{client_id}/?api-version=2021-04-12", password)
        self.client.max_inflight_messages_set(1000)  # the owner keeps its own window
        self.client.max_queued_messages_set(0)
        self.connected = False
        self.refused = False
        self.subscribed = not subscriptions
        self._subscriptions = list(subscriptions)
        self.acks: list[int] = []
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_publish = lambda c, u, mid, rc, props: self.acks.append(mid)
        if on_message is not None:
            self.client.on_message = lambda c, u, msg: on_message(self, msg)
        self.port = port

    def _on_connect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        if rc == 0:
            self.connected = True
            if self._subscriptions:
                c.subscribe(self._subscriptions)
        else:
            self.refused = True

    def _on_subscribe(self, c: paho.Client, u: Any, mid: int, codes: Any, props: Any) -> None:
        if all(not code.is_failure for code in codes):
            self.subscribed = True
        else:
            self.refused = True

    def open(self) -> bool:
        """Connect, subscribe, and wait for a CONNACK and a SUBACK that accept; False (and closed) otherwise."""
        try:
            self.client.connect("127.0.0.1", self.port, keepalive=10)
        except OSError:
            return False
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while not (self.connected and self.subscribed):
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


class _Device:
    """What every device of the run shares, whatever its protocol: the numbering, the classes, the burst grid,
    the window of unacknowledged messages and the record of acks (``Acked``). A subclass sends."""

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
        self._pending: dict[int, tuple[str, bytes]] = {}  # seq -> (class, body), until acked
        self._first_sent: dict[int, float] = {}
        self._acked: list[Acked] = []
        self._publishing = True
        self._abort = threading.Event()
        self._seq = 0
        self.connections = 0
        self.resent = 0  # messages sent again after a reconnect, for want of their ack
        self.refused = 0  # messages the hub refused (AMQP ``rejected``): not stored, not acknowledged, not sent again

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
        """A new message, pending from now on: its number, class and body."""
        self._seq += 1
        seq = self._seq
        r, cls = self._rnd.random(), self._classes[-1][0]
        for name, share in self._classes:
            if r < share:
                cls = name
                break
            r -= share
        body = json.dumps({"device": self.name, "seq": seq, "cls": cls, "t": time.time(), "pad": PAD}).encode()
        with self._lock:
            self._pending[seq] = (cls, body)
            self._first_sent[seq] = time.time()
        return seq, cls, body

    def _resend(self) -> list[tuple[int, str, bytes]]:
        """What a new connection sends first: every pending message, in number order."""
        with self._lock:
            resend = sorted((seq, cls, body) for seq, (cls, body) in self._pending.items())
        self.resent += len(resend)
        return resend

    def _ack(self, seqs: list[int]) -> None:
        at = time.time()
        with self._lock:
            for seq in seqs:
                pending = self._pending.pop(seq, None)
                if pending is not None:
                    self._acked.append(Acked(self.name, seq, pending[0], self._first_sent[seq], at))

    def _refuse(self, seq: int) -> None:
        with self._lock:
            if self._pending.pop(seq, None) is not None:
                self.refused += 1

    def _room(self) -> bool:
        return self.pending() < self._window

    def _done(self) -> bool:
        return not self._publishing and not self.pending()

    def _main(self) -> None:
        try:
            while not self._abort.is_set() and not self._done():
                port = self._port_of()
                if port is None or not self._connection(port):
                    self._abort.wait(RETRY_S)
        except Exception:  # a device that dies says so; the run reports its pending as unacknowledged
            log.exception("chaos.device_failed device=%s", self.name)

    def _connection(self, port: int) -> bool:
        """One connection to the hub on ``port``, until it ends; False when it could not be opened."""
        raise NotImplementedError


class MqttDevice(_Device):
    """A paho device publishing ``rate_hz`` numbered QoS 1 messages a second, classes drawn from ``classes``, in
    bursts of ``burst`` on a grid of ``time.monotonic()`` (every ``burst / rate_hz`` seconds), so that a run can
    aim a kill just after a burst, while the hub is writing it (``bench.chaos.run``)."""

    def _topic(self, seq: int, cls: str) -> str:
        return f"devices/{self.name}/messages/events/$.mid={self.name}-{seq}&cls={cls}&seq={seq}"

    def _connection(self, port: int) -> bool:
        link = _Link(self.name, self._password, port, None)
        if not link.open():
            return False
        self.connections += 1
        mids: dict[int, int] = {}
        for seq, cls, body in self._resend():
            mids[link.client.publish(self._topic(seq, cls), body, qos=1).mid] = seq
        next_tick = math.ceil(time.monotonic() / self._tick_s) * self._tick_s
        while not self._abort.is_set():
            now = time.monotonic()
            if self._publishing and now >= next_tick:
                for _ in range(self._burst):
                    if not self._room():
                        break  # what does not fit is not sent later: no catching up after a stall
                    seq, cls, body = self._next_message()
                    mids[link.client.publish(self._topic(seq, cls), body, qos=1).mid] = seq
                next_tick = (math.floor(now / self._tick_s) + 1) * self._tick_s
            alive = link.pump(0.005)
            if link.acks:
                self._ack([mids.pop(mid, -1) for mid in link.acks])
                link.acks.clear()
            if not alive or self._done():
                break
        link.close()
        return True


class _AmqpConnection(MessagingHandler):  # type: ignore[misc]
    """One AMQP connection of an ``AmqpDevice``, run by its own proton ``Container`` until the connection ends:
    SASL PLAIN, one sender link to the device's telemetry address, transfers unsettled until the hub settles
    them (``accepted`` means durable), the pending ones first, then a burst on each tick of the grid."""

    def __init__(self, device: AmqpDevice, port: int) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.device = device
        self.port = port
        self.opened = False
        self.sender: Any = None
        self.deliveries: dict[Any, int] = {}
        self.next_tick = 0.0

    def on_start(self, event: Any) -> None:
        d = self.device
        conn = event.container.connect(
            f"amqp://127.0.0.1:{self.port}",
            user=f"{d.name}@sas.{HOST_NAME}",
            password=d._password,
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            sasl_enabled=True,
            reconnect=False,
        )
        self.sender = event.container.create_sender(conn, f"/devices/{d.name}/messages/events")
        event.container.schedule(0.005, self)

    def _send(self, seq: int, cls: str, body: bytes) -> None:
        message = Message(
            id=f"{self.device.name}-{seq}", body=body, durable=True, properties={"cls": cls, "seq": str(seq)}
        )
        self.deliveries[self.sender.send(message)] = seq

    def on_link_opened(self, event: Any) -> None:
        if not event.link.is_sender or self.opened:  # proton wraps its link anew for each event: no ``is``
            return
        self.opened = True
        self.device.connections += 1
        for seq, cls, body in self.device._resend():
            self._send(seq, cls, body)
        self.next_tick = math.ceil(time.monotonic() / self.device._tick_s) * self.device._tick_s

    def on_timer_task(self, event: Any) -> None:
        d = self.device
        if d._abort.is_set() or d._done():
            event.container.stop()
            return
        now = time.monotonic()
        if self.opened and d._publishing and now >= self.next_tick:
            for _ in range(d._burst):
                if not d._room() or self.sender.credit <= 0:
                    break  # as the MQTT device: what does not fit is not sent later
                self._send(*d._next_message())
            self.next_tick = (math.floor(now / d._tick_s) + 1) * d._tick_s
        event.container.schedule(0.005, self)

    def on_accepted(self, event: Any) -> None:
        self.device._ack([self.deliveries.pop(event.delivery, -1)])

    def on_rejected(self, event: Any) -> None:
        self.device._refuse(self.deliveries.pop(event.delivery, -1))

    def on_released(self, event: Any) -> None:  # not stored: sent again on the next connection
        self.deliveries.pop(event.delivery, None)
        event.container.stop()

    def on_transport_error(self, event: Any) -> None:
        event.container.stop()

    def on_connection_error(self, event: Any) -> None:
        event.container.stop()

    def on_link_error(self, event: Any) -> None:
        event.container.stop()

    def on_disconnected(self, event: Any) -> None:
        event.container.stop()


class AmqpDevice(_Device):
    """The same device over AMQP 1.0 (python-qpid-proton, the Azure SDKs' own transport): each message a transfer
    with its number as ``message-id`` (``{device}-{seq}``, what the hub's duplicate detection keys on) and ``cls``
    and ``seq`` as application properties, acknowledged when the hub settles it ``accepted``."""

    def _connection(self, port: int) -> bool:
        handler = _AmqpConnection(self, port)
        Container(handler).run()
        return handler.opened


def answer_method(link: _Link, msg: Any, answered: list[str]) -> bool:
    """Answer a direct method call if ``msg`` is one: ``echo`` at once with status 200 and the call's own payload,
    ``ignore`` never (the hub must answer the cloud 504 when its timeout passes). Records the call's id
    (``{"call": id}`` in its payload) in ``answered``; False when ``msg`` is not a call."""
    if not msg.topic.startswith("$iothub/methods/POST/"):
        return False
    name, _, query = msg.topic.removeprefix("$iothub/methods/POST/").partition("/")
    rid = query.partition("$rid=")[2].partition("&")[0]
    if name == "echo":
        link.client.publish(f"$iothub/methods/res/200/?$rid={rid}", msg.payload, qos=0)
        answered.append(str(json.loads(msg.payload)["call"]))
    return True


class _Connected:
    """When a client was connected and subscribed, by its own account: ``(from, to)`` in epoch seconds."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self._since: float | None = None

    def up(self) -> None:
        self._since = time.time()

    def down(self) -> None:
        if self._since is not None:
            self.spans.append((self._since, time.time()))
            self._since = None


METHOD_TOPICS = [("$iothub/methods/POST/#", 0)]


class _Listener:
    """A client that only listens (and answers methods): connects as ``identity`` wherever the hub is now,
    subscribes to ``topics``, hands each message to ``_on_message`` and records when it was connected."""

    def __init__(
        self, identity: str, password: str, port_of: Callable[[], int | None], topics: Sequence[tuple[str, int]]
    ) -> None:
        self.identity = identity
        self._thread = threading.Thread(target=self._main, name=f"chaos.listener.{identity}", daemon=True)
        self._password = password
        self._port_of = port_of
        self._topics = list(topics)
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.connections = 0
        self.answered: list[str] = []  # the ids of the method calls it answered
        self.connected = _Connected()

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def stop(self) -> None:
        self._halt.set()

    def _on_message(self, link: _Link, msg: Any) -> None:
        raise NotImplementedError

    def _main(self) -> None:
        try:
            while not self._halt.is_set():
                port = self._port_of()
                link = _Link(self.identity, self._password, port, self._on_message, self._topics) if port else None
                if link is None or not link.open():
                    self._halt.wait(RETRY_S)
                    continue
                self.connections += 1
                self.connected.up()
                while not self._halt.is_set() and link.pump(0.05):
                    pass
                self.connected.down()
                link.close()
        except Exception:
            log.exception("chaos.listener_failed identity=%s", self.identity)


class ModuleConsumer(_Listener):
    """A module (``device/module``) counting what arrives on its inputs, per ``(device, seq)``, and answering the
    direct methods called on it (``answer_method``)."""

    def __init__(self, identity: str, password: str, port_of: Callable[[], int | None]) -> None:
        super().__init__(identity, password, port_of, METHOD_TOPICS)
        self._received: dict[tuple[str, int], int] = {}
        self._first_arrivals: list[tuple[str, int]] = []

    def received(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return dict(self._received)

    def first_arrivals(self) -> list[tuple[str, int]]:
        """Each ``(device, seq)`` once, in the order it first arrived."""
        with self._lock:
            return list(self._first_arrivals)

    def _on_message(self, link: _Link, msg: Any) -> None:
        if answer_method(link, msg, self.answered):
            return
        body = json.loads(msg.payload)
        key = (str(body["device"]), int(body["seq"]))
        with self._lock:
            n = self._received[key] = self._received.get(key, 0) + 1
            if n == 1:
                self._first_arrivals.append(key)


class CommandDevice(_Listener):
    """A device that receives cloud-to-device messages (``{"n": n}`` bodies, counted per ``n``) and answers direct
    methods (``answer_method``); it publishes nothing. (A device: IoT Hub sends cloud-to-device messages to
    devices only, and so does the hub.)"""

    def __init__(self, identity: str, password: str, port_of: Callable[[], int | None]) -> None:
        super().__init__(
            identity, password, port_of, [(f"devices/{identity}/messages/devicebound/#", 1), *METHOD_TOPICS]
        )
        self._c2d: dict[int, int] = {}

    def c2d_received(self) -> dict[int, int]:
        """How many times each cloud-to-device message (by its number) arrived."""
        with self._lock:
            return dict(self._c2d)

    def _on_message(self, link: _Link, msg: Any) -> None:
        if answer_method(link, msg, self.answered):
            return
        n = int(json.loads(msg.payload)["n"])
        with self._lock:
            self._c2d[n] = self._c2d.get(n, 0) + 1
