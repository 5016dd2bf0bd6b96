"""Capacity planning for several links (``upstream.links``): what a day of given traffic costs when every link is
up, and how long the budget of each other link rides out an outage of the preferred one for the priorities it may
carry. ``edgehub capacity --links MANIFEST --traffic P=RATE ...`` prints it.

The traffic is messages a second per priority, each message ``wire`` bytes on the wire (``capacity.wire_bytes``:
a gzip'ed segment record with an incompressible body, an upper bound) plus the TCP/IP share a link adds
(``budget.wire_bytes``' 52 bytes a 1,448-byte segment). A priority goes over the link ``LinkedUpstream`` would
choose for it (cheapest first, then the order given, among the links that may carry it); budgets are left out of
the normal day (a budget the day's traffic would overrun is named), and assumed whole when an outage begins.

Invariant: pure arithmetic over checked values; a priority no link carries is named, never dropped in silence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from edgehub.core.priorities import format_priorities
from edgehub.upstream.budget import MIB, TCP_IP_HEADER_BYTES, TCP_SEGMENT_BYTES, Period
from edgehub.upstream.links import LinkSpec

__all__ = ["LinkDay", "LinksPlan", "OutageShare", "links_plan"]

DAY_S = 86_400.0
MONTH_DAYS = 30.0  # a month budget's day share, for the day's arithmetic


@dataclass(frozen=True, slots=True)
class LinkDay:
    """One link on a day with every link up."""

    name: str
    carries: str  # the priorities that take it
    bytes_per_day: float
    cost_per_day: float
    needed_bps: float
    rate_bps: float | None  # the link's rate hint, when the manifest gives one
    budget_bytes_per_day: float | None  # a month budget's thirtieth
    over_budget: bool  # the day's traffic overruns its budget


@dataclass(frozen=True, slots=True)
class OutageShare:
    """One link taking over while the preferred link is down."""

    name: str
    carries: str  # the priorities it takes over
    bytes_per_s: float
    cost_per_h: float
    budget_bytes: int | None
    rides_out_s: float | None  # how long its whole budget lasts; None: no budget (it lasts as long as the outage)
    after_budget_carries: str  # the priorities still going once it is spent ("" none)
    after_budget_cost_per_h: float


@dataclass(frozen=True, slots=True)
class LinksPlan:
    wire_bytes: int  # per message, before TCP/IP
    days: tuple[LinkDay, ...]
    cost_per_day: float
    never_leaves: str  # priorities in the traffic no link carries
    outage_of: str  # the preferred link, the one whose outage is planned for
    outage: tuple[OutageShare, ...]
    waits_in_outage: str  # priorities no other link carries: they wait in the store (TTL) through the outage

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _on_wire(rate_per_s: float, wire: int) -> float:
    return rate_per_s * wire * (1 + TCP_IP_HEADER_BYTES / TCP_SEGMENT_BYTES)


def _choice(links: Sequence[LinkSpec], priority: int, down: str | None = None) -> LinkSpec | None:
    preferred = sorted(links, key=lambda s: s.cost_per_mib)  # stable: the order given breaks ties
    return next((s for s in preferred if s.name != down and priority in s.priorities), None)


def links_plan(
    links: Sequence[LinkSpec],
    traffic: Mapping[int, float],
    *,
    wire: int,
    rates_bps: Mapping[str, float] | None = None,
) -> LinksPlan:
    """The plan for ``traffic`` (priority → messages a second) over ``links`` (see the module docstring)."""
    if not links:
        raise ValueError("no links to plan for")
    if not traffic or any(r <= 0 for r in traffic.values()):
        raise ValueError("the traffic must give each priority a positive rate")
    if wire <= 0:
        raise ValueError("the wire bytes per message must be positive")
    rates_bps = rates_bps or {}
    days = []
    for link in links:
        mine = {p: r for p, r in traffic.items() if _choice(links, p) is link}
        per_s = sum(_on_wire(r, wire) for r in mine.values())
        budget = link.budget
        per_day_budget = None
        if budget is not None:
            per_day_budget = budget.limit_bytes / (MONTH_DAYS if budget.period is Period.MONTH else 1.0)
        days.append(
            LinkDay(
                name=link.name,
                carries=format_priorities(frozenset(mine)),
                bytes_per_day=per_s * DAY_S,
                cost_per_day=per_s * DAY_S / MIB * link.cost_per_mib,
                needed_bps=per_s * 8,
                rate_bps=rates_bps.get(link.name),
                budget_bytes_per_day=per_day_budget,
                over_budget=per_day_budget is not None and per_s * DAY_S > per_day_budget,
            )
        )
    never = frozenset(p for p in traffic if _choice(links, p) is None)
    down = sorted(links, key=lambda s: s.cost_per_mib)[0]
    shares = []
    for link in links:
        if link is down:
            continue
        mine = {p: r for p, r in traffic.items() if _choice(links, p, down.name) is link}
        if not mine:
            continue
        per_s = sum(_on_wire(r, wire) for r in mine.values())
        after = {p: r for p, r in mine.items() if p in link.over_budget}
        after_per_s = sum(_on_wire(r, wire) for r in after.values())
        budget = link.budget
        shares.append(
            OutageShare(
                name=link.name,
                carries=format_priorities(frozenset(mine)),
                bytes_per_s=per_s,
                cost_per_h=per_s * 3600 / MIB * link.cost_per_mib,
                budget_bytes=budget.limit_bytes if budget is not None else None,
                rides_out_s=budget.limit_bytes / per_s if budget is not None else None,
                after_budget_carries=format_priorities(frozenset(after)) if budget is not None else "",
                after_budget_cost_per_h=after_per_s * 3600 / MIB * link.cost_per_mib if budget is not None else 0.0,
            )
        )
    waits = frozenset(p for p in traffic if p not in never and _choice(links, p, down.name) is None)
    return LinksPlan(
        wire_bytes=wire,
        days=tuple(days),
        cost_per_day=sum(d.cost_per_day for d in days),
        never_leaves=format_priorities(never),
        outage_of=down.name,
        outage=tuple(shares),
        waits_in_outage=format_priorities(waits),
    )
