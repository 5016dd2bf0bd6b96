"""Kernel shaping with tc tbf in a network namespace caps loopback throughput (root only)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from edgehub.testing.tcshape import TbfNamespace, tc_available

_PROBE = """
import socket, threading, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
def echo():
    c, _ = s.accept()
    while d := c.recv(65536):
        c.sendall(d)
threading.Thread(target=echo, daemon=True).start()
c = socket.create_connection(s.getsockname())
t = time.monotonic(); c.sendall(b"y" * 20000); n = 0
while n < 20000:
    n += len(c.recv(65536))
print(time.monotonic() - t)
"""


@pytest.mark.skipif(not tc_available(), reason="needs root and the ip/tc tools")
async def test_tbf_namespace_caps_loopback_throughput_to_its_rate() -> None:
    rate_bps = 160_000.0  # 20 kB/s through lo, shared by both directions
    with TbfNamespace(f"ehtest{os.getpid()}", rate_bps=rate_bps) as ns:
        proc = await asyncio.create_subprocess_exec(
            *ns.command(sys.executable, "-c", _PROBE), stdout=asyncio.subprocess.PIPE
        )
        async with asyncio.timeout(30):
            out, _ = await proc.communicate()
    elapsed = float(out)
    expected = 2 * 20_000 * 8 / rate_bps  # there and back through the one shaped loopback
    assert elapsed >= expected * 0.7
    assert elapsed <= expected * 3 + 1
