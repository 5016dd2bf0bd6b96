"""``SystemdNotifier`` against a real unix datagram socket, as systemd's ``NOTIFY_SOCKET`` is: the states arrive as
sent, in the abstract namespace too; the watchdog pings every half period; without a socket nothing is sent and a
socket that is gone is a warning, never an exception."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgehub.runtime.sdnotify import SystemdNotifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    try:
        yield path, sock
    finally:
        sock.close()


async def receive(sock: socket.socket) -> str:
    async with asyncio.timeout(5):
        return (await asyncio.get_running_loop().sock_recv(sock, 4096)).decode()


async def test_ready_and_stopping_arrive_on_the_notify_socket(listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    notifier = SystemdNotifier.from_environment({"NOTIFY_SOCKET": path})
    notifier.ready("listening: tls 127.0.0.1:8883")
    assert await receive(sock) == "READY=1\nSTATUS=listening: tls 127.0.0.1:8883"
    notifier.stopping()
    assert await receive(sock) == "STOPPING=1"


async def test_the_abstract_namespace_is_reached_by_its_at_name() -> None:
    name = f"edgehub-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.setblocking(False)
        assert SystemdNotifier(f"@{name}").notify("READY=1")
        assert await receive(sock) == "READY=1"


async def test_the_watchdog_pings_every_half_period_while_its_block_runs(listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    notifier = SystemdNotifier.from_environment({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    assert notifier.watchdog_s == 0.2
    async with notifier.watchdog():
        assert [await receive(sock) for _ in range(3)] == ["WATCHDOG=1"] * 3
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "runtime.sd_watchdog"]  # no pinger left behind


def test_the_watchdog_is_left_to_the_process_systemd_named() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "5000000", "WATCHDOG_PID": str(os.getpid() + 1)}
    assert SystemdNotifier.from_environment(env).watchdog_s is None
    env["WATCHDOG_PID"] = str(os.getpid())
    assert SystemdNotifier.from_environment(env).watchdog_s == 5.0


def test_without_a_socket_nothing_is_sent_and_a_missing_one_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert not SystemdNotifier.from_environment({}).notify("READY=1")
    gone = SystemdNotifier(str(tmp_path / "no-such-socket"))
    with caplog.at_level(logging.WARNING, "edgehub.runtime.sdnotify"):
        assert not gone.notify("WATCHDOG=1")
        assert not gone.notify("WATCHDOG=1")
    assert [r.getMessage().split(" ")[0] for r in caplog.records] == ["sdnotify.send_failed"]
