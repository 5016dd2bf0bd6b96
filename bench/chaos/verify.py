"""The chaos verifier: every message a device got a PUBACK for, against what reached the lake and the modules.

Pure: it takes what the run recorded and returns a ``Verdict``; it opens nothing, so its rules are tested on
small hand-made inputs (``tests/bench/test_chaos_verify.py``).

The rules, and why:

* **acknowledged**: distinct ``(device, seq)`` a publisher got an ack for. An ack means durable, so each of these
  must reach every destination its class is routed to, unless its TTL passed first.
* **delivered**: acknowledged and present at every destination (the lake's bronze table; the module's input).
* **expired** (accounted for, not lost), by TTL arithmetic rather than the hub's counters (they live in memory
  and a SIGKILL takes them): the hub fixes a message's TTL at enqueue and the enqueue happens after the device
  first sent it, so the message cannot have expired before ``first_sent_at + ttl_s``. An acknowledged message
  that did not reach a destination is expired only when its class's route has a TTL and
  ``first_sent_at + ttl_s <= ended_at`` (the moment the verifier stopped waiting): its TTL could have passed
  before it could be delivered. A message whose TTL cannot have passed yet, or that has no TTL route, is lost.
* **lost**: acknowledged, not delivered, not expired. Must be 0.
* **duplicates**: lake rows beyond the first for one ``(device, seq)``. Must be 0 (the hub's duplicate detection
  drops a device's re-sends of what it stored, the Spark job's dedup drops the hub's re-sends of a batch).
  Modules may see a message twice (QoS 1 is at least once and a kill can come between delivery and
  checkpoint): counted apart as ``module_redeliveries``, not a failure.
* **order_violations**, in two parts that see the hub's enqueue order two ways:

  - the lake exposes it as ``enqueued_at`` (the store's wall clock at the durable write, millisecond
    resolution). For one device and one priority, rows sorted by ``enqueued_at`` must have increasing device
    numbers; a row enqueued strictly later than a row with a higher number is one violation. Rows within the
    same millisecond are a tie the lake cannot order, never counted here. Of a message's several rows (a
    duplicate, counted as one) the earliest stands for it;
  - the landing zone the lake is made from keeps it exactly within a batch: a segment is one priority and a run
    of consecutive queue offsets, its lines in offset order. In each segment, one device's numbers must
    increase from line to line; a line whose number is below an earlier one of that device is one violation
    (the same number again is a duplicate, counted as such). This covers the ties above, which is where a
    re-send after a kill would land.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Acked", "LakeRow", "Route", "Verdict", "verify"]


@dataclass(frozen=True, slots=True)
class Route:
    """Where a message class goes: ``lake`` ($upstream) and/or ``module``; ``ttl_s`` None for a long TTL."""

    priority: int
    lake: bool
    module: bool
    ttl_s: float | None = None


@dataclass(frozen=True, slots=True)
class Acked:
    """One message a publisher got an ack for; times are wall-clock epoch seconds."""

    device: str
    seq: int
    cls: str
    first_sent_at: float
    acked_at: float


@dataclass(frozen=True, slots=True)
class LakeRow:
    device: str
    seq: int
    priority: int
    enqueued_at: float  # epoch seconds, millisecond resolution


@dataclass
class Verdict:
    acknowledged: int = 0
    delivered: int = 0
    expired: int = 0
    lost: int = 0
    duplicates: int = 0
    order_violations: int = 0
    kills: int = 0
    module_redeliveries: int = 0
    lake_rows: int = 0
    segment_order_violations: int = 0
    module_order_violations: int = 0
    unacknowledged_in_lake: int = 0  # stored, its ack lost to a kill, and the device gave up re-sending: fine
    lost_examples: list[str] = field(default_factory=list)
    order_examples: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """The JSON line: the seven keys the issue names first, then the rest."""
        return {
            "acknowledged": self.acknowledged,
            "delivered": self.delivered,
            "expired": self.expired,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "order_violations": self.order_violations,
            "kills": self.kills,
            "module_redeliveries": self.module_redeliveries,
            "lake_rows": self.lake_rows,
            "segment_order_violations": self.segment_order_violations,
            "module_order_violations": self.module_order_violations,
            "unacknowledged_in_lake": self.unacknowledged_in_lake,
        }


def _order_violations(rows: Iterable[LakeRow], examples: list[str]) -> int:
    first: dict[tuple[str, int, int], LakeRow] = {}
    for r in rows:  # a second row of one message is a duplicate, counted as such: its first row takes its place
        key = (r.device, r.seq, r.priority)
        if key not in first or r.enqueued_at < first[key].enqueued_at:
            first[key] = r
    lanes: dict[tuple[str, int], list[LakeRow]] = defaultdict(list)
    for r in first.values():
        lanes[(r.device, r.priority)].append(r)
    count = 0
    for (device, priority), lane in sorted(lanes.items()):
        # Ties (same millisecond) sort by number, so only a strict enqueue inversion can show as a drop.
        lane.sort(key=lambda r: (r.enqueued_at, r.seq))
        highest: LakeRow | None = None
        for r in lane:
            if highest is not None and r.seq < highest.seq:
                count += 1
                if len(examples) < 10:
                    examples.append(
                        f"{device} p{priority}: #{r.seq} enqueued at {r.enqueued_at:.3f} after "
                        f"#{highest.seq} at {highest.enqueued_at:.3f}"
                    )
            elif highest is None or r.seq > highest.seq:
                highest = r
    return count


def _runs_out_of_order(runs: Iterable[Sequence[tuple[str, int]]], where: str, examples: list[str]) -> int:
    """In each run, the entries whose number is below an earlier one of their device."""
    count = 0
    for i, lines in enumerate(runs):
        highest: dict[str, int] = {}
        for device, seq in lines:
            top = highest.get(device)
            if top is not None and seq < top:  # seq == top: a duplicate, counted as such
                count += 1
                if len(examples) < 10:
                    examples.append(f"{where} {i}: {device} #{seq} after #{top}")
            else:
                highest[device] = seq
    return count


def verify(
    *,
    acked: Iterable[Acked],
    routes: Mapping[str, Route],
    lake: Iterable[LakeRow],
    module_received: Mapping[tuple[str, int], int],
    ended_at: float,
    kills: int,
    segments: Iterable[Sequence[tuple[str, int]]] = (),
    module_first_arrivals: Sequence[tuple[str, int]] = (),
) -> Verdict:
    """Compare ``acked`` with the ``lake`` rows and ``module_received`` (times each ``(device, seq)`` arrived);
    ``segments`` are the landing zone's segments, each as its lines' ``(device, seq)`` in line order;
    ``module_first_arrivals`` each ``(device, seq)`` the module got, once, in the order it first arrived."""
    v = Verdict(kills=kills)
    lake_rows = list(lake)
    v.lake_rows = len(lake_rows)
    in_lake: dict[tuple[str, int], int] = defaultdict(int)
    for r in lake_rows:
        in_lake[(r.device, r.seq)] += 1
    v.duplicates = sum(n - 1 for n in in_lake.values())
    v.module_redeliveries = sum(n - 1 for n in module_received.values() if n > 1)
    seen: set[tuple[str, int]] = set()
    for a in sorted(acked, key=lambda a: (a.device, a.seq)):
        key = (a.device, a.seq)
        if key in seen:
            continue
        seen.add(key)
        v.acknowledged += 1
        route = routes[a.cls]
        missing = [
            where
            for where, wanted, got in (
                ("lake", route.lake, key in in_lake),
                ("module", route.module, key in module_received),
            )
            if wanted and not got
        ]
        if not missing:
            v.delivered += 1
        elif route.ttl_s is not None and a.first_sent_at + route.ttl_s <= ended_at:
            v.expired += 1
        else:
            v.lost += 1
            if len(v.lost_examples) < 10:
                v.lost_examples.append(
                    f"{a.device} #{a.seq} ({a.cls}) missing from {'+'.join(missing)}; "
                    f"first sent {a.first_sent_at:.3f}, acked {a.acked_at:.3f}"
                )
    v.unacknowledged_in_lake = sum(1 for key in in_lake if key not in seen)
    v.segment_order_violations = _runs_out_of_order(segments, "segment", v.order_examples)
    v.module_order_violations = _runs_out_of_order([module_first_arrivals], "module", v.order_examples)
    v.order_violations = _order_violations(lake_rows, v.order_examples) + v.segment_order_violations
    return v
