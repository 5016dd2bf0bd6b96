"""Debian's RabbitMQ (``apt install rabbitmq-server``, 3.10 on Debian 12) as a benchmark peer: one node in a temp
dir with the AMQP 1.0 and MQTT plugins, on free loopback ports, run as a context manager.

``with RabbitMq(work) as rmq:`` gives ``rmq.amqp_port`` (AMQP 0-9-1 and 1.0 share it: the plugin answers the 1.0
header), ``rmq.mqtt_port`` and ``rmq.cpu_s()`` (CPU seconds of the node's processes: beam.smp and its helpers,
not epmd). ``available()`` says whether it is installed. The node's epmd, if this started it, is stopped after.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import psutil

__all__ = ["RabbitMq", "available"]

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


def available() -> bool:
    return SERVER.exists() and shutil.which("erl") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _epmd_pids() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "epmd"}


class RabbitMq:
    def __init__(self, work: Path) -> None:
        self.work = work / "rabbitmq"
        self.amqp_port = _free_port()
        self.mqtt_port = _free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._epmd_before: set[int] = set()

    def __enter__(self) -> RabbitMq:
        w = self.work
        w.mkdir(parents=True)
        (w / "enabled_plugins").write_text("[rabbitmq_amqp1_0,rabbitmq_mqtt].\n")
        # Durable queues with persistent messages: a publish is confirmed (AMQP 1.0: settled accepted; MQTT QoS 1:
        # PUBACK) once the queue has written it, the guarantee edgehub's acks give.
        (w / "rabbit.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
            f"mqtt.listeners.tcp.default = 127.0.0.1:{self.mqtt_port}\n"
            "mqtt.allow_anonymous = true\nmqtt.durable_queue_type = classic\nloopback_users = none\n"
        )
        env = {
            **os.environ,
            "HOME": str(w),
            "RABBITMQ_NODENAME": f"bench{self.amqp_port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_DIST_PORT": str(_free_port()),
            "RABBITMQ_MNESIA_BASE": str(w / "mnesia"),
            "RABBITMQ_LOG_BASE": str(w / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(w / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(w / "rabbit"),
            "RABBITMQ_PID_FILE": str(w / "pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        self._epmd_before = _epmd_pids()
        self._proc = subprocess.Popen(
            [str(SERVER)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.mqtt_port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError("RabbitMQ did not start in 90 s")

    def _node(self) -> list[psutil.Process]:
        if self._proc is None:
            return []
        try:
            root = psutil.Process(self._proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_s(self) -> float:
        total = 0.0
        for p in self._node():
            try:
                if p.name() != "epmd":
                    t = p.cpu_times()
                    total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            procs = self._node()
            os.killpg(self._proc.pid, signal.SIGTERM)
            _, alive = psutil.wait_procs(procs, timeout=30)
            for p in alive:
                p.kill()
            self._proc = None
        for pid in _epmd_pids() - self._epmd_before:  # the epmd this node started, by its pid
            os.kill(pid, signal.SIGTERM)
