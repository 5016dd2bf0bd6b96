"""Capacity planning, Service Bus style: how many messages a store holds, how long an outage it rides out, and
whether the uplink catches up afterwards.

Service Bus sizes a queue by its messages' size (body plus properties plus headers). Here a message costs, on
the store's disk, its **charged size** (body plus property names and values, as its producer sent it: what the
hub's quotas and ``maxMessageSizeBytes`` count) plus the **store's per-message overhead**: the hub's stamps
(``edgeMessageId``, ``enqueuedTime``), the msgpack framing, the key, the queue reference, RocksDB's block and
index share. That overhead is measured, not guessed: ``measure_overhead`` writes messages with incompressible
bodies routed to one endpoint into a real RocksDB store in a temporary folder, closes it (its memtables are
flushed to table files) and divides the growth of its table and log files by the count. Measured on the
development box with ``edgehub capacity --measure --message-bytes N`` (5,000 messages; 2,000 and 20,000 give the
same within 4 B):

    message    512 B   1 KiB   4 KiB
    overhead   160 B   166 B   189 B

``MEASURED_OVERHEAD`` states that table; ``overhead_bytes(n)`` interpolates it (held flat outside it). The figures
are an upper bound: RocksDB compresses a block (Snappy) when that saves at least an eighth of it, so JSON bodies
and, in small messages, the repeated property names cost less (a 256 B message with a random body measured 24 B
of overhead, held at 160 B here); each further route adds a queue reference (~12 B).
``tests/runtime/test_capacity.py`` checks the table against a real store within 20 %.

On the wire a message costs its segment record (JSON with the body as text or base64, gzip'ed per batch):
``wire_bytes`` encodes a segment of such messages and divides, again with incompressible bodies (an upper bound:
telemetry JSON compresses several times).

Invariant: the arithmetic (``plan``) is pure and total over valid input; invalid input is ``ValueError`` with the
quantity named, which the command line turns into a usage error.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from edgehub.core import Message, RouteResult
from edgehub.store.records import charged_size
from edgehub.store.rocks import open_rocks_store
from edgehub.upstream.segment import encode_segment, record_from_message

__all__ = [
    "MEASURED_OVERHEAD",
    "CapacityPlan",
    "Measurement",
    "measure_overhead",
    "overhead_bytes",
    "plan",
    "wire_bytes",
]

# (charged body bytes, overhead bytes), measured as the module docstring says.
MEASURED_OVERHEAD: tuple[tuple[int, int], ...] = ((512, 160), (1024, 166), (4096, 189))

# What a device's message carries besides its body, as the hub stores it (one application property, the
# connection's system properties, and the two stamps the overhead includes).
_PROPERTIES = {"alert": "false"}
_SYSTEM = {"connectionDeviceId": "dev1", "connectionAuthMethod": "sas"}


def overhead_bytes(message_bytes: int) -> int:
    """The store's per-message overhead for a message of ``message_bytes`` charged bytes (``MEASURED_OVERHEAD``
    interpolated, flat outside it)."""
    points = MEASURED_OVERHEAD
    if message_bytes <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if message_bytes <= x1:
            return round(y0 + (y1 - y0) * (message_bytes - x0) / (x1 - x0))
    return points[-1][1]


def _message(body_bytes: int, n: int, *, stamped: bool, random_bytes: Callable[[int], bytes] = os.urandom) -> Message:
    system = {**_SYSTEM, "messageId": f"m{n:08d}"}
    if stamped:
        system |= {"edgeMessageId": random_bytes(16).hex(), "enqueuedTime": "2026-11-25T17:12:18.968208+00:00"}
    return Message(body=random_bytes(body_bytes), properties=_PROPERTIES, system_properties=system)


def _body_for(message_bytes: int) -> int:
    """The body length that makes a message of ``message_bytes`` charged bytes with the usual properties."""
    return max(0, message_bytes - charged_size(_message(0, 0, stamped=False)))


@dataclass(frozen=True, slots=True)
class Measurement:
    messages: int
    charged_bytes: int  # per message, as quotas count it
    disk_bytes: float  # per message, the store's table and log files
    overhead_bytes: float  # disk less charged


def _store_bytes(path: Path) -> int:
    """The bytes of the store's data files (tables, logs, MANIFEST), not RocksDB's text ``LOG`` files."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.name.startswith("LOG"))


async def _measure(path: Path, message_bytes: int, messages: int) -> Measurement:
    store = open_rocks_store(path)
    await store.close()
    empty = _store_bytes(path)
    body = _body_for(message_bytes)
    store = open_rocks_store(path)
    try:
        for first in range(0, messages, 500):
            group = [
                (_message(body, n, stamped=True), [RouteResult("$upstream", 5)])
                for n in range(first, min(messages, first + 500))
            ]
            await store.enqueue_many(group)
    finally:
        await store.close()  # flushes the memtables into table files
    charged = charged_size(_message(body, 0, stamped=True))
    disk = (_store_bytes(path) - empty) / messages
    return Measurement(messages=messages, charged_bytes=charged, disk_bytes=disk, overhead_bytes=disk - charged)


def measure_overhead(message_bytes: int, *, messages: int = 5000, folder: Path | None = None) -> Measurement:
    """Write ``messages`` messages of ``message_bytes`` charged bytes (incompressible bodies, one route) into a new
    RocksDB store under ``folder`` (a temporary one by default) and measure what each costs on disk."""
    if messages < 1 or message_bytes < 1:
        raise ValueError("messages and message_bytes must be positive")
    with tempfile.TemporaryDirectory(prefix="edgehub-capacity-", dir=folder) as tmp:
        return asyncio.run(_measure(Path(tmp) / "store", message_bytes, messages))


def wire_bytes(message_bytes: int, *, batch: int = 50) -> int:
    """Bytes per message in an upstream segment of ``batch`` such messages (incompressible bodies), gzip'ed."""
    body = _body_for(message_bytes)
    # Random bytes from a fixed seed: as incompressible as os.urandom's, and the same question gets the same answer
    # on every run (gzip's output of fresh random bytes moves by a byte or so, and docs/operating.md shows it).
    random_bytes = random.Random(message_bytes).randbytes
    records = [
        record_from_message(
            _message(body, n, stamped=True, random_bytes=random_bytes),
            hub_id="edgehub",
            edge_message_id=random_bytes(16).hex(),
            enqueued_at_s=1_795_000_000.0 + n,
            priority=5,
            ttl_s=86_400.0,
        )
        for n in range(batch)
    ]
    return -(-len(encode_segment(records)) // batch)


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """What ``plan`` worked out; each field's unit is in its name. None: not asked (no store size, no uplink)."""

    message_bytes: int
    overhead_bytes: int
    stored_bytes: int  # per message on disk: message + overhead
    wire_bytes: int  # per message on the uplink
    rate_per_s: float
    ttl_s: float
    inflow_bytes_per_s: float  # store growth while the uplink is down
    ttl_messages: int  # held at most (older ones expire): rate x TTL
    ttl_store_bytes: int  # the store an outage as long as the TTL needs
    store_bytes: int | None
    fits_messages: int | None
    full_after_s: float | None  # outage length that fills the store; None: never (the TTL empties it first)
    survives_s: float | None  # longest outage without a message lost: the TTL, or the time to fill the store
    uplink_bps: float | None
    needed_bps: float  # uplink bits per second the steady flow needs
    uplink_use: float | None  # needed / uplink; >= 1: the uplink never keeps up
    drain_s: float | None  # after an outage of ``survives_s`` (or the TTL), until the backlog is sent; None: never

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def plan(
    *,
    message_bytes: int,
    rate_per_s: float,
    ttl_s: float,
    store_bytes: int | None = None,
    uplink_bps: float | None = None,
    overhead: int | None = None,
    wire: int | None = None,
) -> CapacityPlan:
    """The arithmetic. ``overhead`` and ``wire`` (bytes per message) default to ``overhead_bytes`` and
    ``wire_bytes`` of ``message_bytes``."""
    for name, value in (("message size", message_bytes), ("rate", rate_per_s), ("ttl", ttl_s)):
        if not value > 0:
            raise ValueError(f"the {name} must be positive")
    if store_bytes is not None and store_bytes < 1:
        raise ValueError("the store size must be positive")
    if uplink_bps is not None and not uplink_bps > 0:
        raise ValueError("the uplink rate must be positive")
    overhead = overhead_bytes(message_bytes) if overhead is None else overhead
    wire = wire_bytes(message_bytes) if wire is None else wire
    stored = message_bytes + overhead
    ttl_messages = int(rate_per_s * ttl_s)
    fits = full_after = survives = None
    if store_bytes is not None:
        fits = store_bytes // stored
        full_after = fits / rate_per_s if fits < ttl_messages else None
        survives = full_after if full_after is not None else ttl_s
    needed_bps = rate_per_s * wire * 8
    use = drain = None
    if uplink_bps is not None:
        use = needed_bps / uplink_bps
        spare_per_s = uplink_bps / 8 / wire - rate_per_s  # messages a second beyond the steady flow
        outage_s = survives if survives is not None else ttl_s
        drain = rate_per_s * outage_s / spare_per_s if spare_per_s > 0 else None
    return CapacityPlan(
        message_bytes=message_bytes,
        overhead_bytes=overhead,
        stored_bytes=stored,
        wire_bytes=wire,
        rate_per_s=rate_per_s,
        ttl_s=ttl_s,
        inflow_bytes_per_s=rate_per_s * stored,
        ttl_messages=ttl_messages,
        ttl_store_bytes=ttl_messages * stored,
        store_bytes=store_bytes,
        fits_messages=fits,
        full_after_s=full_after,
        survives_s=survives,
        uplink_bps=uplink_bps,
        needed_bps=needed_bps,
        uplink_use=use,
        drain_s=drain,
    )
