"""A constrained link you can steer: an asyncio TCP proxy that shapes the bytes in both directions.

Each accepted connection is paired with one connection to the target. In each direction a *pump* reads from
one side and a *delay line* writes to the other:

* **rate** (bit/s, ``None`` = unshaped): a token bucket on bytes. The pump reads at most one chunk
  (``chunk_bytes``, about one MTU) and takes its tokens before reading the next, so the sender's own socket
  buffers fill while the link is busy, exactly as behind a slow modem; bytes never pile up inside the proxy.
* **delay** (one way, seconds) with uniform **jitter** (± ``jitter_s``): a chunk is written ``delay ± jitter``
  after it finished serialising; delivery times never go backwards (TCP is in order).
* **cut()**: the link drops hard: every open connection is aborted (RST) and new connections are accepted and
  closed at once, until ``restore()``.
* **go_silent()**: the link dies silently: nothing is forwarded in either direction, no FIN, no RST, and new
  connections are accepted but carry nothing. ``restore()`` resumes forwarding where it stopped, as TCP
  retransmission would after a real outage; a peer that gave up meanwhile (keepalive) closes its side itself.
* **set_rate()** changes the rate live; **outage** schedules ``(down_s, period_s)``: down for ``down_s`` at
  the end of every ``period_s`` (``60s/300s``: up 240 s, down 60 s), silent or cut per ``outage_mode``.

Invariants: bytes are forwarded unchanged and in order per direction; a byte is never forwarded while the link
is cut or silent; ``stats`` counts what was delivered to each side.

The CLI (``edgehub link-sim``) is ``edgehub.runtime.cli.linksim``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Self

from edgehub.core.units import parse_duration_s, parse_rate_bps

__all__ = ["LinkSim", "LinkStats", "OutageMode", "parse_duration_s", "parse_rate_bps"]

log = logging.getLogger(__name__)


class OutageMode(StrEnum):
    SILENT = "silent"
    CUT = "cut"


@dataclass(frozen=True, slots=True)
class LinkStats:
    """Bytes delivered so far: ``up`` from the listening side to the target, ``down`` the other way; and the bytes
    that entered the link (``*_sent_bytes``: read from the sender, not yet through the delay line)."""

    up_bytes: int
    down_bytes: int
    connections: int
    up_sent_bytes: int = 0
    down_sent_bytes: int = 0


class _TokenBucket:
    """Bytes at ``rate_bytes_s`` with a burst of ``burst_bytes``; ``rate_bytes_s=None`` means unlimited."""

    def __init__(self, rate_bytes_s: float | None, burst_bytes: int) -> None:
        self.rate_bytes_s = rate_bytes_s
        self.burst_bytes = burst_bytes
        self._tokens = float(burst_bytes)
        self._at = asyncio.get_running_loop().time()

    def _refill(self, now: float) -> None:
        if self.rate_bytes_s is not None:
            self._tokens = min(float(self.burst_bytes), self._tokens + (now - self._at) * self.rate_bytes_s)
        self._at = now

    async def take(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        if self.rate_bytes_s is None:
            return
        self._refill(loop.time())
        self._tokens -= n  # may go negative: a chunk larger than the burst waits for its whole debt
        while self._tokens < 0:
            rate = self.rate_bytes_s
            if rate is None:
                self._tokens = 0.0
                return
            await asyncio.sleep(-self._tokens / rate)
            self._refill(loop.time())


class _Conn:
    """One proxied connection: two pumps and two delay lines."""

    def __init__(
        self,
        sim: LinkSim,
        c_reader: asyncio.StreamReader,
        c_writer: asyncio.StreamWriter,
        t_reader: asyncio.StreamReader,
        t_writer: asyncio.StreamWriter,
    ) -> None:
        self.sim = sim
        self.writers = (c_writer, t_writer)
        self.tasks: list[asyncio.Task[None]] = []
        for name, reader, writer, direction in (
            ("up", c_reader, t_writer, "up"),
            ("down", t_reader, c_writer, "down"),
        ):
            line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
            self.tasks.append(asyncio.create_task(self._pump(reader, line, direction), name=f"linksim.pump.{name}"))
            self.tasks.append(asyncio.create_task(self._deliver(line, writer, direction), name=f"linksim.line.{name}"))

    async def _pump(self, reader: asyncio.StreamReader, line: asyncio.Queue[tuple[float, bytes]], d: str) -> None:
        sim, loop = self.sim, asyncio.get_running_loop()
        bucket = sim.bucket(d)
        last_due = 0.0
        while True:
            await sim.wait_flowing()
            data = await reader.read(sim.chunk_bytes)
            if not data:
                line.put_nowait((loop.time(), b""))  # EOF travels down the line like a byte (FIN)
                return
            sim.count_sent(d, len(data))
            await bucket.take(len(data))
            await sim.wait_flowing()
            jitter = random.uniform(-sim.jitter_s, sim.jitter_s) if sim.jitter_s else 0.0
            due = max(last_due, loop.time() + max(0.0, sim.delay_s + jitter))
            last_due = due
            line.put_nowait((due, data))

    async def _deliver(self, line: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter, d: str) -> None:
        sim, loop = self.sim, asyncio.get_running_loop()
        while True:
            due, data = await line.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await sim.wait_flowing()
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
            sim.count_delivered(d, len(data))

    def abort(self) -> None:
        for w in self.writers:
            w.transport.abort()  # RST, not FIN
        for t in self.tasks:
            t.cancel()

    async def run(self) -> None:
        try:
            await asyncio.wait(self.tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in self.tasks:
                t.cancel()
            for w in self.writers:
                w.close()
            for t in self.tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    log.debug("linksim.conn_error error=%r", t.exception())


class LinkSim:
    """A shaped TCP link from ``listen`` to ``target``. Use as ``async with LinkSim(...) as link``."""

    def __init__(
        self,
        *,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        rate_bps: float | None = None,
        delay_s: float = 0.0,
        jitter_s: float = 0.0,
        chunk_bytes: int = 1460,
        outage: tuple[float, float] | None = None,
        outage_mode: OutageMode = OutageMode.SILENT,
    ) -> None:
        """``rate_bps`` bits per second each way; ``delay_s``/``jitter_s`` one way; ``outage=(down_s, period_s)``."""
        if delay_s < 0 or jitter_s < 0 or chunk_bytes <= 0:
            raise ValueError("delay, jitter and chunk size must be non-negative (chunk positive)")
        if rate_bps is not None and rate_bps <= 0:
            raise ValueError("rate_bps must be positive or None")
        if outage is not None and not 0 < outage[0] < outage[1]:
            raise ValueError("outage must be (down_s, period_s) with 0 < down_s < period_s")
        self.target_host, self.target_port = target_host, target_port
        self.listen_host, self._listen_port = listen_host, listen_port
        self.delay_s, self.jitter_s, self.chunk_bytes = delay_s, jitter_s, chunk_bytes
        self.outage, self.outage_mode = outage, outage_mode
        self._rate_bps = rate_bps
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._cut = False
        self._closing = False
        self._state_changed = asyncio.Event()
        self._up = 0
        self._down = 0
        self._sent = {"up": 0, "down": 0}
        self._accepted = 0
        self._buckets: dict[str, _TokenBucket] = {}

    # -- life cycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        burst = self.chunk_bytes
        rate_bytes_s = self._rate_bps / 8 if self._rate_bps is not None else None
        self._buckets = {"up": _TokenBucket(rate_bytes_s, burst), "down": _TokenBucket(rate_bytes_s, burst)}
        self._server = await asyncio.start_server(self._accept, self.listen_host, self._listen_port)
        if self.outage is not None:
            self._spawn(self._outage_loop(*self.outage), "linksim.outages")
        log.info("linksim.started listen=%s:%d target=%s:%d", self.listen_host, self.port, *self._target())

    async def close(self) -> None:
        self._closing = True
        self._flowing.set()
        if self._server is not None:
            self._server.close()
        for c in list(self._conns):
            c.abort()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- steering ---------------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("LinkSim not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def rate_bps(self) -> float | None:
        return self._rate_bps

    @property
    def is_up(self) -> bool:
        return self._flowing.is_set() and not self._cut

    async def wait_until(self, *, up: bool) -> None:
        """Return once the link is up (or down). Bound it with ``asyncio.timeout``."""
        while self.is_up != up:
            self._state_changed.clear()
            await self._state_changed.wait()

    def _changed(self) -> None:
        self._state_changed.set()

    def set_rate(self, rate_bps: float | None) -> None:
        """Change the rate of both directions now (``None``: unshaped)."""
        if rate_bps is not None and rate_bps <= 0:
            raise ValueError("rate_bps must be positive or None")
        self._rate_bps = rate_bps
        for b in self._buckets.values():
            b.rate_bytes_s = rate_bps / 8 if rate_bps is not None else None
        log.info("linksim.rate rate_bps=%s", rate_bps)

    def cut(self) -> None:
        """Drop the link hard: abort every connection (RST) and refuse new ones until ``restore()``."""
        self._cut = True
        for c in list(self._conns):
            c.abort()
        self._changed()
        log.info("linksim.cut connections=%d", len(self._conns))

    def go_silent(self) -> None:
        """Stop forwarding in both directions without FIN or RST, until ``restore()``."""
        self._flowing.clear()
        self._changed()
        log.info("linksim.silent connections=%d", len(self._conns))

    def restore(self) -> None:
        """Bring the link back after ``cut()`` or ``go_silent()``."""
        self._cut = False
        self._flowing.set()
        self._changed()
        log.info("linksim.restored")

    @property
    def stats(self) -> LinkStats:
        return LinkStats(
            up_bytes=self._up,
            down_bytes=self._down,
            connections=len(self._conns),
            up_sent_bytes=self._sent["up"],
            down_sent_bytes=self._sent["down"],
        )

    @property
    def accepted(self) -> int:
        """Connections accepted since start (including refused ones during a cut)."""
        return self._accepted

    async def wait_accepted(self, n: int) -> None:
        """Return once ``accepted`` reaches ``n``. Bound it with ``asyncio.timeout``."""
        while self._accepted < n:
            self._state_changed.clear()
            await self._state_changed.wait()

    # -- what a connection's pumps ask of the link ------------------------------------------------------------

    def bucket(self, direction: str) -> _TokenBucket:
        """The token bucket that paces ``direction`` ("up", "down")."""
        return self._buckets[direction]

    async def wait_flowing(self) -> None:
        """Return at once while the link is up; during an outage, once it is restored."""
        await self._flowing.wait()

    def count_sent(self, direction: str, n: int) -> None:
        """``n`` bytes entered the link in ``direction`` (``stats``)."""
        self._sent[direction] += n

    def count_delivered(self, direction: str, n: int) -> None:
        """``n`` bytes went through in ``direction`` (``stats``)."""
        if direction == "up":
            self._up += n
        else:
            self._down += n

    # -- internals --------------------------------------------------------------------------------------------

    def _target(self) -> tuple[str, int]:
        return self.target_host, self.target_port

    def _spawn(self, coro: object, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self._accepted += 1
        self._changed()
        if self._cut or self._closing:
            c_writer.transport.abort()
            return
        try:
            t_reader, t_writer = await asyncio.open_connection(*self._target())
        except OSError as exc:
            log.info("linksim.target_unreachable error=%r", exc)
            c_writer.transport.abort()
            return
        conn = _Conn(self, c_reader, c_writer, t_reader, t_writer)
        self._conns.add(conn)
        try:
            await conn.run()
        finally:
            self._conns.discard(conn)

    async def _outage_loop(self, down_s: float, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s - down_s)
            if self.outage_mode is OutageMode.CUT:
                self.cut()
            else:
                self.go_silent()
            await asyncio.sleep(down_s)
            self.restore()
