"""Capacity planning for several links (``upstream.links``): what a day of given traffic costs when every link is
up, and how long the budget of each other link rides out an outage of the preferred one for the priorities it may
carry. ``edgehub capacity --links MANIFEST --traffic P=RATE ...`` prints it.

The traffic is messages a second per priority, each message ``wire`` bytes on the wire (``capacity.wire_bytes``:
a gzip'ed segment record with an incompressible body, an upper bound) plus the TCP/IP share a link adds
(``budget.wire_bytes``' 52 bytes a 1,448-byte segment). A priority goes over the link ``LinkedUpstream`` would
choose for it (cheapest first, then the order given, among the links that may carry it); budgets are left out of
the normal day (a day budget the day's traffic would overrun is named, and a month budget says how many days of
this traffic it lasts), and assumed whole when an outage begins. In an outage, a day budget that a whole day of
the traffic does not spend never runs out (it starts again each day); one that it does, and a month budget, run out
after their bytes at the outage's rate, and the first of them to run out is the one named; a month budget also
says how many days of the outage it lasts (each day taking the day budget's share, when there is one).

Invariant: pure arithmetic over checked values; a priority no link carries is named, never dropped in silence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from edgehub.core.priorities import format_priorities
from edgehub.upstream.budget import MIB, TCP_IP_HEADER_BYTES, TCP_SEGMENT_BYTES, Budget, Period
from edgehub.upstream.links import LinkSpec

__all__ = ["LinkDay", "LinksPlan", "OutageShare", "links_plan"]

DAY_S = 86_400.0
LONGEST_MONTH_DAYS = 31  # a month budget that lasts fewer days of the traffic does not hold for every month


@dataclass(frozen=True, slots=True)
class LinkDay:
    """One link on a day with every link up."""

    name: str
    carries: str  # the priorities that take it
    bytes_per_day: float
    cost_per_day: float
    needed_bps: float
    rate_bps: float | None  # the link's rate hint, when the manifest gives one
    day_budget_bytes: int | None
    month_budget_bytes: int | None
    month_budget_lasts_days: float | None  # days of this traffic the month budget lasts (None: none, or no traffic)
    over_day_budget: bool  # a day of the traffic overruns the day budget
    over_month_budget: bool  # the month budget lasts fewer days than the longest month


@dataclass(frozen=True, slots=True)
class OutageShare:
    """One link taking over while the preferred link is down."""

    name: str
    carries: str  # the priorities it takes over
    bytes_per_s: float
    cost_per_h: float
    budget_period: str | None  # the budget that runs out first (or, when none does, the first); None: no budget
    budget_bytes: int | None
    rides_out_s: float | None  # how long until that budget runs out; None: no budget runs out, whatever the outage
    after_budget_carries: str  # the priorities still going once it is spent ("" none)
    after_budget_cost_per_h: float
    month_budget_lasts_days: float | None  # days of the outage its month budget lasts (None: no month budget)


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


def _budget_of(link: LinkSpec, period: Period) -> Budget | None:
    return next((b for b in link.budgets if b.period is period), None)


def _first_spent(budgets: Sequence[Budget], per_s: float) -> tuple[Budget | None, float | None]:
    """The budget an outage's ``per_s`` bytes a second spends first, and after how long (see the module
    docstring); ``(the first budget, None)`` when none runs out, ``(None, None)`` without a budget."""
    runs_out = [
        (b.limit_bytes / per_s, b)
        for b in budgets
        if per_s > 0 and (b.period is Period.MONTH or per_s * DAY_S > b.limit_bytes)
    ]
    if not runs_out:
        return (budgets[0] if budgets else None), None
    seconds, budget = min(runs_out, key=lambda t: t[0])
    return budget, seconds


def _month_lasts_days(link: LinkSpec, per_s: float, after_per_s: float) -> float | None:
    """Days of an outage at ``per_s`` its month budget lasts: a day of the outage takes the whole day's traffic, or
    its day budget and then the priorities allowed past it (``after_per_s``) for the rest of the day."""
    month, day = _budget_of(link, Period.MONTH), _budget_of(link, Period.DAY)
    if month is None:
        return None
    per_day = per_s * DAY_S
    if day is not None and per_day > day.limit_bytes:
        per_day = day.limit_bytes + after_per_s * (DAY_S - day.limit_bytes / per_s)
    return month.limit_bytes / per_day if per_day > 0 else None


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
        day_budget, month_budget = _budget_of(link, Period.DAY), _budget_of(link, Period.MONTH)
        per_day = per_s * DAY_S
        lasts = month_budget.limit_bytes / per_day if month_budget is not None and per_day > 0 else None
        days.append(
            LinkDay(
                name=link.name,
                carries=format_priorities(frozenset(mine)),
                bytes_per_day=per_day,
                cost_per_day=per_day / MIB * link.cost_per_mib,
                needed_bps=per_s * 8,
                rate_bps=rates_bps.get(link.name),
                day_budget_bytes=day_budget.limit_bytes if day_budget is not None else None,
                month_budget_bytes=month_budget.limit_bytes if month_budget is not None else None,
                month_budget_lasts_days=lasts,
                over_day_budget=day_budget is not None and per_day > day_budget.limit_bytes,
                over_month_budget=lasts is not None and lasts < LONGEST_MONTH_DAYS,
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
        first, rides_out_s = _first_spent(link.budgets, per_s)
        shares.append(
            OutageShare(
                name=link.name,
                carries=format_priorities(frozenset(mine)),
                bytes_per_s=per_s,
                cost_per_h=per_s * 3600 / MIB * link.cost_per_mib,
                budget_period=first.period.value if first is not None else None,
                budget_bytes=first.limit_bytes if first is not None else None,
                rides_out_s=rides_out_s,
                after_budget_carries=format_priorities(frozenset(after)) if link.budgets else "",
                after_budget_cost_per_h=after_per_s * 3600 / MIB * link.cost_per_mib if link.budgets else 0.0,
                month_budget_lasts_days=_month_lasts_days(link, per_s, after_per_s),
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
