"""The chaos run's cloud: a paho client on the cloud Mosquitto that sends cloud-to-device messages and calls
direct methods, as IoT Hub's service side would, through the same broker and link the hub's upstream uses.

* Cloud-to-device: every ``c2d_every_s`` one QoS 1 message for the command device on
  ``devices/{d}/messages/devicebound/$.mid=c2d-{n}&n={n}``, body ``{"n": n}``. ``c2d_acked()`` is what the broker
  acknowledged: the broker keeps it for the hub's persistent session, the hub stores it before it acknowledges,
  so each of these must reach the device.
* Direct methods: every ``call_every_s`` one call, in turn on the command device and on the module
  (``$iothub/{d}[/{m}]/methods/POST/{name}/?$rid={n}&$timeout={s}``), ``echo`` (answered 200 with its payload)
  three times in four, else ``ignore`` (never answered: the hub must answer 504 once the timeout passed).
  Calls are QoS 0 and never stored anywhere, so a call made while the link or the hub is down gets no answer.
  Each answer on ``$iothub/+/methods/res/#`` / ``$iothub/+/+/methods/res/#`` is recorded with its status,
  payload and time (``Call``).

It runs on its own thread with its own paho loop; the broker never goes away, so it connects once.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

__all__ = ["Call", "Cloud"]


@dataclass
class Call:
    """One direct method call the cloud made, and every answer it got: ``(status, payload, at)``."""

    call_id: str
    target: str  # "device" or "device/module"
    name: str  # "echo" or "ignore"
    timeout_s: float
    sent_at: float  # epoch seconds
    payload: bytes
    answers: list[tuple[int, bytes, float]] = field(default_factory=list)


class Cloud:
    def __init__(
        self,
        port: int,
        *,
        device: str,
        module: str,
        c2d_every_s: float = 2.0,
        call_every_s: float = 1.5,
        timeout_s: float = 10.0,
    ) -> None:
        self._port = port
        self._device = device
        self._targets = (device, module)
        self._c2d_every_s = c2d_every_s
        self._call_every_s = call_every_s
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._c2d_mids: dict[int, int] = {}  # paho mid -> n
        self._c2d_acked: list[int] = []
        self._c2d_sent = 0
        self._calls: dict[str, Call] = {}
        self.stray_answers: list[str] = []  # answers to no call of ours: a hub that made one up
        self._sending = True
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._main, name="chaos.cloud", daemon=True)
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="chaos-cloud")
        self.client.max_inflight_messages_set(1000)
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message

    def start(self) -> None:
        self.client.connect("127.0.0.1", self._port, keepalive=30)
        self.client.subscribe([("$iothub/+/methods/res/#", 0), ("$iothub/+/+/methods/res/#", 0)])
        self._thread.start()

    def stop_sending(self) -> None:
        self._sending = False

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(5)
        self.client.disconnect()

    def c2d_acked(self) -> list[int]:
        with self._lock:
            return list(self._c2d_acked)

    def c2d_sent(self) -> int:
        return self._c2d_sent

    def calls(self) -> list[Call]:
        with self._lock:
            return [
                Call(c.call_id, c.target, c.name, c.timeout_s, c.sent_at, c.payload, list(c.answers))
                for c in self._calls.values()
            ]

    def _on_publish(self, c: paho.Client, u: Any, mid: int, rc: Any, props: Any) -> None:
        with self._lock:
            n = self._c2d_mids.pop(mid, None)
            if n is not None:
                self._c2d_acked.append(n)

    def _on_message(self, c: paho.Client, u: Any, msg: Any) -> None:
        # $iothub/{d}[/{m}]/methods/res/{status}/?$rid={rid}
        head, _, rest = msg.topic.partition("/methods/res/")
        status, _, query = rest.partition("/")
        rid = query.partition("$rid=")[2].partition("&")[0]
        with self._lock:
            call = self._calls.get(rid)
            if call is None or head != f"$iothub/{call.target}" or not status.isdigit():
                self.stray_answers.append(msg.topic)
                return
            call.answers.append((int(status), bytes(msg.payload), time.time()))

    def _send_c2d(self, n: int) -> None:
        topic = f"devices/{self._device}/messages/devicebound/$.mid=c2d-{n}&n={n}"
        with self._lock:  # the mid is known before its PUBACK can be handled
            self._c2d_mids[self.client.publish(topic, json.dumps({"n": n}).encode(), qos=1).mid] = n
        self._c2d_sent = n

    def _call(self, n: int) -> None:
        target = self._targets[n % 2]
        name = "ignore" if n % 4 == 3 else "echo"
        call_id = str(n)
        payload = json.dumps({"call": call_id}).encode()
        with self._lock:
            self._calls[call_id] = Call(call_id, target, name, self._timeout_s, time.time(), payload)
        topic = f"$iothub/{target}/methods/POST/{name}/?$rid={call_id}&$timeout={self._timeout_s:g}"
        self.client.publish(topic, payload, qos=0)

    def _main(self) -> None:
        next_c2d = next_call = time.monotonic() + 1.0
        c2d_n = call_n = 0
        while not self._halt.is_set():
            now = time.monotonic()
            if self._sending and now >= next_c2d:
                c2d_n += 1
                self._send_c2d(c2d_n)
                next_c2d += self._c2d_every_s
            if self._sending and now >= next_call:
                call_n += 1
                self._call(call_n)
                next_call += self._call_every_s
            self.client.loop(timeout=0.05)
