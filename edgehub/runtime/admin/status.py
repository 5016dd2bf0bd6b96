"""What ``edgehub status`` shows (docs/operating.md, "Status"), read from a running hub or a stopped hub's store.

``collect_status(store, hub=..., heads=..., rates=...)`` gathers, without counting anything per message (it reads
what the store, the executors and the transports keep anyway):
* per endpoint and priority: queue length (offsets past the checkpoint: expired ones not yet skipped included),
  bytes (a bounded walk of the queue's references: ``bytes_partial`` when it stopped at ``_MAX_REFS_WALKED``),
  oldest message's age, messages in flight and messages of a failed batch waiting for their retry (running hub
  only), the executor's state;
* per endpoint: what it holds, its dead letters (counted up to ``_MAX_DEAD_COUNTED``);
* the upstream: each lane's connection, achieved rate, RTT (least of the last acks) and messages acked (running
  hub with an MQTT upstream); with ``upstream.links``, each lane's links (``edgehub.runtime.admin.links``); on a
  stopped hub, ``link_ledger``: each link's bytes and cost per period from the budget file alone (the CLI reads
  it, as only it knows the data directory; None in a running hub's document, whose ``links`` say more);
* the store: messages and bytes held against its quota, the ingest rate and the rate it shrinks by, and the time
  until it is full at those rates (``RateTracker``: samples of the store's counters, running hub only).

``GET /status`` serves it as JSON (bearer token); the CLI prints it or, with ``--json``, prints that JSON.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgehub.hub.facade import EdgeHub
from edgehub.runtime.admin.api import RouteHandler
from edgehub.runtime.admin.heads import LiveConnections, connected_count
from edgehub.runtime.admin.http import Request, Response
from edgehub.runtime.admin.links import format_links, format_stopped_links, links_document
from edgehub.store import Store

__all__ = ["RateTracker", "collect_status", "format_status", "status_routes"]

_MAX_REFS_WALKED = 10_000  # per queue, for its bytes: a status must not hold the event loop reading a million
_MAX_DEAD_COUNTED = 1_000  # each one is read with its message


@dataclass(frozen=True, slots=True)
class _Sample:
    at_s: float
    ingested_bytes: int
    held_bytes: int


class RateTracker:
    """The store's ingest rate and net growth over the last ``window_s``, from samples of counters it keeps
    (``Store.ingested``, ``Store.usage``). ``sample`` is called every ``interval_s`` by ``run``."""

    def __init__(self, store: Store, *, window_s: float = 60.0, interval_s: float = 5.0) -> None:
        if window_s <= 0 or interval_s <= 0:
            raise ValueError("window_s and interval_s must be positive")
        self._store = store
        self.interval_s = interval_s
        self._samples: deque[_Sample] = deque(maxlen=max(2, int(window_s / interval_s) + 1))

    def sample(self, now_s: float | None = None) -> None:
        at = time.monotonic() if now_s is None else now_s
        self._samples.append(_Sample(at, self._store.ingested()[1], self._store.usage(None)[1]))

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def rates(self) -> tuple[float, float] | None:
        """(bytes in per second, bytes out per second) over the window; None before two samples."""
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        span = last.at_s - first.at_s
        if span <= 0:
            return None
        rate_in = (last.ingested_bytes - first.ingested_bytes) / span
        growth = (last.held_bytes - first.held_bytes) / span
        return rate_in, max(0.0, rate_in - growth)


def collect_status(
    store: Store,
    *,
    hub: EdgeHub | None = None,
    heads: Sequence[LiveConnections] | None = None,
    rates: RateTracker | None = None,
    now_s: float | None = None,
) -> dict[str, Any]:
    """The status document (module docstring); ``hub``/``heads``/``rates`` None on a stopped hub's store."""
    now = store.clock.time() if now_s is None else now_s
    queues: list[dict[str, Any]] = []
    endpoints: dict[str, dict[str, Any]] = {}
    for q in store.queues():
        cp = store.checkpoint(q)
        start = cp.committed + 1
        refs = store.references(q, start, _MAX_REFS_WALKED)
        executor = hub.executors.get(q.endpoint) if hub is not None else None
        in_flight, retrying = executor.in_flight(q.priority) if executor is not None else (None, None)
        queues.append(
            {
                "endpoint": q.endpoint,
                "priority": q.priority,
                "length": max(0, store.end_offset(q) - start),
                "bytes": sum(r.size_bytes for r in refs),
                "bytes_partial": len(refs) >= _MAX_REFS_WALKED,
                "oldest_age_s": round(max(0.0, now - refs[0].enqueued_at_s), 3) if refs else None,
                "in_flight": in_flight,
                "retrying": retrying,
                "state": executor.state(q.priority).value if executor is not None else None,
            }
        )
        if q.endpoint not in endpoints:
            held = store.usage(q.endpoint)
            dead = len(store.dead_letters(q.endpoint, _MAX_DEAD_COUNTED))
            endpoints[q.endpoint] = {
                "messages": held[0],
                "bytes": held[1],
                "dead_letters": dead,
                "dead_letters_partial": dead >= _MAX_DEAD_COUNTED,
            }
    messages, held_bytes = store.usage(None)
    quota = store.store_quota.max_bytes
    measured = rates.rates() if rates is not None else None
    full_in_s: float | None = None
    if measured is not None and quota is not None:
        net = measured[0] - measured[1]
        full_in_s = round(max(0, quota - held_bytes) / net, 1) if net > 0 else None
    status: dict[str, Any] = {
        "running": hub is not None,
        "queues": queues,
        "endpoints": endpoints,
        "store": {
            "messages": messages,
            "bytes": held_bytes,
            "quota_bytes": quota,
            "used_fraction": round(held_bytes / quota, 4) if quota else None,
            "in_bps": round(measured[0], 1) if measured is not None else None,
            "out_bps": round(measured[1], 1) if measured is not None else None,
            "full_in_s": full_in_s,
        },
        "upstream": _upstream(hub),
        "links": links_document(hub),
        "link_ledger": None,  # a stopped hub's budget file (edgehub.runtime.cli.status)
        "connected_clients": connected_count(heads) if heads is not None else None,
    }
    return status


def _upstream(hub: EdgeHub | None) -> list[dict[str, Any]] | None:
    if hub is None:
        return None
    lanes = []
    for lane in hub.upstream_status().lanes:
        t = lane.transport
        lanes.append(
            {
                "endpoint": lane.endpoint_id,
                "up": lane.up,
                "connected": t.connected if t is not None else None,
                "rate_bps": round(t.achieved_bps, 1) if t is not None else None,
                "rtt_s": t.rtt_min_s if t is not None else None,
                "messages_acked": t.messages_acked if t is not None else None,
                "batches_sent": lane.batches_sent,
            }
        )
    return lanes


def format_status(status: dict[str, Any]) -> list[str]:
    """The status as lines for a terminal."""
    s = status["store"]
    quota = s["quota_bytes"]
    lines = [
        f"hub: {'running' if status['running'] else 'stopped (read from the data directory)'}",
        f"store: {s['messages']} messages, {_size(s['bytes'])}"
        + (f" of {_size(quota)} ({100 * s['used_fraction']:.1f}%)" if quota else " (no quota)"),
    ]
    if s["in_bps"] is not None:
        full = s["full_in_s"]
        lines.append(
            f"rates: in {_size(s['in_bps'])}/s, out {_size(s['out_bps'])}/s; full "
            + (f"in {_duration(full)}" if full is not None else "never at these rates")
        )
    if status["connected_clients"] is not None:
        lines.append(f"connected clients: {status['connected_clients']}")
    lines.append("queues (endpoint priority: length, bytes, oldest, in flight, retrying, state):")
    for q in status["queues"]:
        oldest = _duration(q["oldest_age_s"]) if q["oldest_age_s"] is not None else "-"
        in_flight = q["in_flight"] if q["in_flight"] is not None else "-"
        retrying = q["retrying"] if q["retrying"] is not None else "-"
        size = _size(q["bytes"]) + ("+" if q["bytes_partial"] else "")
        lines.append(
            f"  {q['endpoint']} p{q['priority']}: {q['length']}, {size}, {oldest}, {in_flight}, {retrying}, "
            f"{q['state'] or '-'}"
        )
    for name, e in status["endpoints"].items():
        if e["dead_letters"]:
            lines.append(f"dead letters: {name}: {e['dead_letters']}{'+' if e['dead_letters_partial'] else ''}")
    for lane in status["upstream"] or []:
        rtt = f"{1000 * lane['rtt_s']:.0f} ms" if lane["rtt_s"] is not None else "-"
        rate = f"{_size(lane['rate_bps'])}/s" if lane["rate_bps"] is not None else "-"
        state = {True: "connected", False: "disconnected", None: "-"}[lane["connected"]]
        lines.append(f"upstream {lane['endpoint']}: {state}, rate {rate}, rtt {rtt}, acked {lane['messages_acked']}")
    lines.extend(format_links(status.get("links")))
    lines.extend(format_stopped_links(status.get("link_ledger")))
    return lines


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"


def status_routes(
    store: Store, hub: EdgeHub, heads: Sequence[LiveConnections], rates: RateTracker
) -> list[tuple[str, str, RouteHandler, bool]]:
    async def status(request: Request, params: tuple[str, ...]) -> Response:
        return Response.json(200, collect_status(store, hub=hub, heads=heads, rates=rates))

    return [("GET", "/status", status, False)]
