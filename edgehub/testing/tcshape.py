"""Kernel-level shaping: a network namespace whose loopback is capped by ``tc tbf`` (root only).

``TbfNamespace(name, rate_bps=...)`` creates namespace ``name``, brings its ``lo`` up and puts a token bucket
filter on it; every process started with ``ip netns exec NAME ...`` (or ``command(...)``) then talks over a
loopback the kernel shapes, with no proxy in the path. Each packet crosses ``lo`` once, so the cap is shared
by both directions. Only ``tbf`` is used: kernels without ``sch_netem`` (like the one these tests run on)
still have it; delay and jitter need the userspace ``LinkSim``.

``delete()`` removes the namespace and with it the qdisc; processes still inside keep it alive until they end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from types import TracebackType
from typing import Self

__all__ = ["TbfNamespace", "TcError", "tc_available"]


class TcError(RuntimeError):
    """An ``ip`` or ``tc`` command failed; the message holds its stderr."""


def _run(args: Sequence[str]) -> None:
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise TcError(f"{' '.join(args)}: {proc.stderr.strip()}")


def tc_available() -> bool:
    """Root, and the ``ip`` and ``tc`` tools present."""
    return os.geteuid() == 0 and shutil.which("tc") is not None and shutil.which("ip") is not None


class TbfNamespace:
    """A namespace whose loopback runs at ``rate_bps`` (``burst_bytes`` bucket, ``latency_s`` queue)."""

    def __init__(self, name: str, *, rate_bps: float, burst_bytes: int = 1600, latency_s: float = 0.4) -> None:
        if rate_bps <= 0 or burst_bytes <= 0 or latency_s <= 0:
            raise ValueError("rate_bps, burst_bytes and latency_s must be positive")
        self.name = name
        self.rate_bps = rate_bps
        self.burst_bytes = burst_bytes
        self.latency_s = latency_s
        self._created = False

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def create(self) -> None:
        _run(["ip", "netns", "add", self.name])
        self._created = True
        try:
            # tbf drops any packet larger than its burst; loopback's 64 KiB MTU would exceed it, so lo gets an
            # Ethernet-sized MTU, which is also what a real uplink carries.
            _run(self.command("ip", "link", "set", "lo", "mtu", "1500", "up"))
            self.set_rate(self.rate_bps)
        except TcError:
            self.delete()
            raise

    def set_rate(self, rate_bps: float) -> None:
        """(Re)apply the cap; ``replace`` works whether a qdisc is there or not."""
        self.rate_bps = rate_bps
        rate, latency = f"{int(rate_bps)}bit", f"{int(self.latency_s * 1000)}ms"
        tbf = ["rate", rate, "burst", str(self.burst_bytes), "latency", latency]
        _run(self.command("tc", "qdisc", "replace", "dev", "lo", "root", "tbf", *tbf))

    def delete(self) -> None:
        if self._created:
            self._created = False
            _run(["ip", "netns", "del", self.name])

    def __enter__(self) -> Self:
        self.create()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.delete()
