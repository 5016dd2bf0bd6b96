"""The upstream links (``upstream.links``) as ``edgehub status``, ``GET /status`` and ``GET /metrics`` show them: per
lane and link its state, bytes and cost this period, budget left, and the priorities it carries now
(``edgehub.upstream.links.LinkStatus``). A hub without links shows none (``None`` in the status document).

A link with a day and a month budget is counted over both: the document's single figures (``bytes_this_period``,
``budget_left_bytes``, ...) are those of the period that binds (the budget with the fewest bytes left), and
``periods`` lists each; the metrics carry a ``period`` label (``day``, ``month``) on the per-period gauges. A
stopped hub's links come from the budget file alone (``stopped_links_document``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgehub.core.priorities import parse_priorities
from edgehub.hub.facade import EdgeHub
from edgehub.upstream.budget import (
    BudgetMark,
    LedgerFileError,
    PeriodCount,
    binding,
    cost_of,
    left_of,
    period_end,
    read_ledger_file,
)
from edgehub.upstream.links import LinkedUpstream, LinkState, LinkStatus

if TYPE_CHECKING:
    from prometheus_client.core import Metric

__all__ = ["format_links", "format_stopped_links", "link_metrics", "links_document", "stopped_links_document"]

_MARK_LEVEL = {BudgetMark.UNDER: 0, BudgetMark.WARN: 80, BudgetMark.SPENT: 100}


def _lanes(hub: EdgeHub) -> Iterator[tuple[str, tuple[LinkStatus, ...]]]:
    for lane_id in hub.lanes.lane_ids:
        endpoint = hub.given_endpoint(lane_id)
        if isinstance(endpoint, LinkedUpstream):
            yield lane_id, endpoint.links_status()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def _period_entry(c: PeriodCount) -> dict[str, Any]:
    return {
        "period": c.period.value,
        "start_hour_utc": c.start_hour_utc,
        "period_start": _iso(c.period_start_s),
        "period_end": _iso(c.period_end_s),
        "bytes": c.bytes,
        "cost": round(c.cost, 4),
        "budget_bytes": c.budget_bytes,
        "budget_left_bytes": c.left_bytes,
        "budget_used_percent": _MARK_LEVEL[c.mark],
    }


def _figures(periods: tuple[PeriodCount, ...]) -> dict[str, Any]:
    """The single figures of the period that binds, and every period's."""
    c = binding(periods)
    return {
        "period": c.period.value,
        "period_start": _iso(c.period_start_s),
        "bytes_this_period": c.bytes,
        "bytes_estimated": True,  # TCP/IP and TLS overhead estimated (edgehub.upstream.budget)
        "cost_this_period": round(c.cost, 4),
        "budget_bytes": c.budget_bytes,
        "budget_left_bytes": c.left_bytes,
        "budget_used_percent": _MARK_LEVEL[c.mark],
        "periods": [_period_entry(p) for p in periods],
    }


def links_document(hub: EdgeHub | None) -> list[dict[str, Any]] | None:
    """Every lane's links, for the status document; None without links (or a stopped hub)."""
    if hub is None:
        return None
    out = []
    for lane_id, links in _lanes(hub):
        for s in links:
            out.append(
                {
                    "lane": lane_id,
                    "link": s.name,
                    "state": s.state.value,
                    "preference": s.preference,
                    "carries_now": s.carries_now,
                    "priorities": s.priorities,
                    "cost_per_mib": s.cost_per_mib,
                    **_figures(s.periods),
                    "batches": s.batches,
                    "connects": s.connects,
                }
            )
    return out or None


def stopped_links_document(path: Path, now_s: float) -> dict[str, Any]:
    """A stopped hub's links, from its budget file at ``path`` alone: ``{"links": [...]}`` with each link's counts
    as last written (a period that has since ended is marked ``ended``, its bytes no longer this period's), or
    ``{"links": [], "missing": bool, "unreadable": reason}`` when the file is missing or cannot be read."""
    try:
        saved = read_ledger_file(path)
    except LedgerFileError as exc:
        return {"path": str(path), "links": [], "missing": not path.exists(), "unreadable": exc.reason}
    links = []
    for name, counts in saved.links.items():
        cost_per_mib = saved.cost_per_mib[name]
        periods = []
        for c in counts:
            ended = (
                c.period is not None
                and c.start_hour_utc is not None
                and now_s >= period_end(c.period_start_s, c.period, c.start_hour_utc)
            )
            periods.append(
                {
                    "period": c.period.value if c.period is not None else None,
                    "period_start": _iso(c.period_start_s),
                    "ended": ended,
                    "bytes": c.bytes,
                    "cost": round(cost_of(c.bytes, cost_per_mib), 4) if cost_per_mib is not None else None,
                    "budget_bytes": c.budget_bytes,
                    "budget_left_bytes": left_of(c.budget_bytes, c.bytes),
                    "budget_used_percent": _MARK_LEVEL[c.mark],
                }
            )
        links.append({"link": name, "cost_per_mib": cost_per_mib, "periods": periods})
    return {"path": str(path), "version": saved.version, "links": links}


def _budget_text(left: int | None, budget: int | None, percent: int) -> str:
    if budget is None or left is None:
        return ""
    return f", budget {left} of {budget} B left" + (f" (past {percent}%)" if percent else "")


def format_links(links: list[dict[str, Any]] | None) -> list[str]:
    """The links as terminal lines, one per lane and link, then one per period when it has two."""
    lines = []
    for k in links or []:
        lines.append(
            f"link {k['lane']} {k['link']}: {k['state']}, carries {k['carries_now'] or 'nothing'} "
            f"(may carry {k['priorities']}), {k['bytes_this_period']} B this {k['period']} (cost "
            f"{k['cost_this_period']})"
            + _budget_text(k["budget_left_bytes"], k["budget_bytes"], k["budget_used_percent"])
        )
        if len(k["periods"]) > 1:
            for p in k["periods"]:
                lines.append(
                    f"  this {p['period']} (from {p['period_start']}): {p['bytes']} B (cost {p['cost']})"
                    + _budget_text(p["budget_left_bytes"], p["budget_bytes"], p["budget_used_percent"])
                )
    return lines


def format_stopped_links(doc: dict[str, Any] | None) -> list[str]:
    """A stopped hub's links (``stopped_links_document``) as terminal lines: one per link and period counted, or
    one line saying why there are none."""
    if doc is None:
        return []
    if doc.get("missing"):
        return [f"links: none counted (no {doc['path']}: a hub without upstream.links, or whose links never sent)"]
    if "unreadable" in doc:
        return [f"links: budget file {doc['path']} not read ({doc['unreadable']}): no link counts to show"]
    lines = []
    for k in doc["links"]:
        for p in k["periods"]:
            what = f"this {p['period']}" if p["period"] is not None else "this period"
            if p["ended"]:
                what = f"the {p['period']} that ended (0 B since)"
            cost = f" (cost {p['cost']})" if p["cost"] is not None else ""
            lines.append(
                f"link {k['link']}: {p['bytes']} B {what} from {p['period_start']}{cost}"
                + _budget_text(p["budget_left_bytes"], p["budget_bytes"], p["budget_used_percent"])
            )
    return lines or ["links: the budget file counts no link"]


def link_metrics(hub: EdgeHub) -> Iterator[Metric]:
    """``edgehub_link_*`` gauges per lane and link (none without links)."""
    labels = ["lane", "link"]
    # Imported at the first scrape, as metrics.py imports prometheus-client: a hub nobody scrapes does not carry it
    from prometheus_client.core import GaugeMetricFamily

    up = GaugeMetricFamily("edgehub_link_up", "1 while the link is up and settled, 0.5 settling, 0 down", labels=labels)
    per_period = [*labels, "period"]
    sent = GaugeMetricFamily(
        "edgehub_link_period_bytes", "Bytes on the wire this period (overhead estimated)", labels=per_period
    )
    cost = GaugeMetricFamily("edgehub_link_period_cost", "What this period's bytes cost", labels=per_period)
    left = GaugeMetricFamily("edgehub_link_budget_left_bytes", "Bytes left in this period's budget", labels=per_period)
    used = GaugeMetricFamily(
        "edgehub_link_budget_used_percent_mark", "Budget mark reached this period: 0, 80 or 100", labels=per_period
    )
    carries = GaugeMetricFamily(
        "edgehub_link_carries", "1 for each priority the link would carry now", labels=[*labels, "priority"]
    )
    found = False
    for lane_id, links in _lanes(hub):
        for s in links:
            found = True
            key = [lane_id, s.name]
            up.add_metric(key, {LinkState.UP: 1.0, LinkState.SETTLING: 0.5, LinkState.DOWN: 0.0}[s.state])
            for c in s.periods:
                per = [*key, c.period.value]
                sent.add_metric(per, c.bytes)
                cost.add_metric(per, c.cost)
                if c.left_bytes is not None:
                    left.add_metric(per, c.left_bytes)
                    used.add_metric(per, _MARK_LEVEL[c.mark])
            for p in sorted(parse_priorities(s.carries_now)) if s.carries_now else ():
                carries.add_metric([*key, str(p)], 1)
    if found:
        yield from (up, sent, cost, left, used, carries)
