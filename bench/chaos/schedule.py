"""The chaos schedule: every kill, outage and rate change of a run, drawn up front from one seed.

The schedule is a pure function of ``(seed, duration_s)``: the same arguments give the same events at the same
offsets, so a failing run is replayed with its ``--seed``. What it cannot fix is timing inside the hub (when a
kill lands relative to a write), which is the point of running it.

Invariants: events are sorted by time and all fall inside ``[0, duration_s)``; link outages never overlap
(each ends with a ``restore`` before the next begins) and none is still on at the end; there are at least two
kills whatever the duration, each in its own slot of the run, so kills are spread and never back to back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["RATES_BPS", "Event", "EventKind", "make_schedule"]

# The link rates a run switches between, bits per second: a thin cellular link up to a good one.
RATES_BPS = (32_000.0, 64_000.0, 128_000.0, 256_000.0, 1_000_000.0)
_EDGE_S = 8.0  # no kill or outage in the first or last seconds: the run starts and ends with everything up


class EventKind(StrEnum):
    KILL = "kill"  # SIGKILL the hub; ``value`` seconds later it is started again on the same data directory
    SILENT = "silent"  # the link stops moving bytes (no FIN, no RST)
    CUT = "cut"  # the link resets every connection and refuses new ones
    RESTORE = "restore"  # the link is back after SILENT or CUT
    RATE = "rate"  # the link's rate becomes ``value`` bit/s


@dataclass(frozen=True, slots=True)
class Event:
    at_s: float
    kind: EventKind
    value: float = 0.0
    offset_s: float = 0.0  # KILL: how long after the devices' next burst (the run aims kills at the hub's writes)

    def describe(self) -> str:
        if self.kind is EventKind.KILL:
            return f"kill {self.offset_s * 1000:.0f} ms after a burst (restart after {self.value:.1f} s)"
        if self.kind is EventKind.RATE:
            return f"rate {self.value / 1000:g} kbit/s"
        return self.kind.value


def _slots(rnd: random.Random, count: int, start_s: float, end_s: float) -> list[tuple[float, float]]:
    """``count`` equal, disjoint slots between ``start_s`` and ``end_s``."""
    width = (end_s - start_s) / count
    return [(start_s + i * width, start_s + (i + 1) * width) for i in range(count)]


def make_schedule(seed: int, duration_s: float) -> list[Event]:
    """The events of a run of ``duration_s`` seconds (at least 30)."""
    if duration_s < 30:
        raise ValueError(f"a chaos run needs at least 30 s, not {duration_s}")
    rnd = random.Random(seed)
    events: list[Event] = []
    lo, hi = _EDGE_S, duration_s - _EDGE_S
    # Kills: one in each of max(2, one per ~40 s) slots, somewhere in its middle, 0-20 ms after a burst of the
    # devices, down for 0-3 s.
    for a, b in _slots(rnd, max(2, round(duration_s / 40)), lo, hi):
        width = b - a
        at, down_s, offset_s = a + rnd.uniform(0.2, 0.8) * width, round(rnd.uniform(0.0, 3.0), 2), rnd.uniform(0, 0.02)
        events.append(Event(at, EventKind.KILL, down_s, offset_s=round(offset_s, 4)))
    # Outages: one in each of max(2, one per ~25 s) slots, silent or cut, 2 s up to most of the slot (at most
    # 40 s, past the upstream's 30 s ack timeout in long runs, so a silent link is also given up on).
    for a, b in _slots(rnd, max(2, round(duration_s / 25)), lo, hi):
        width = b - a
        length = rnd.uniform(2.0, min(40.0, 0.7 * width))
        start = a + rnd.uniform(0.0, width - length - 0.5)
        kind = EventKind.SILENT if rnd.random() < 0.5 else EventKind.CUT
        events.append(Event(start, kind))
        events.append(Event(start + length, EventKind.RESTORE))
    # Rate changes every 4-15 s, the whole run through.
    t = rnd.uniform(2.0, 6.0)
    while t < duration_s:
        events.append(Event(t, EventKind.RATE, rnd.choice(RATES_BPS)))
        t += rnd.uniform(4.0, 15.0)
    events.sort(key=lambda e: e.at_s)
    return events
