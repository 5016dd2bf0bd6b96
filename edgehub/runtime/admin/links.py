"""The upstream links (``upstream.links``) as ``edgehub status``, ``GET /status`` and ``GET /metrics`` show them: per
lane and link its state, bytes and cost this period, budget left, and the priorities it carries now
(``edgehub.upstream.links.LinkStatus``). A hub without links shows none (``None`` in the status document).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from edgehub.core.priorities import parse_priorities
from edgehub.hub.facade import EdgeHub
from edgehub.upstream.budget import BudgetMark
from edgehub.upstream.links import LinkedUpstream, LinkState, LinkStatus

if TYPE_CHECKING:
    from prometheus_client.core import Metric

__all__ = ["format_links", "link_metrics", "links_document"]

_MARK_LEVEL = {BudgetMark.UNDER: 0, BudgetMark.WARN: 80, BudgetMark.SPENT: 100}


def _lanes(hub: EdgeHub) -> Iterator[tuple[str, tuple[LinkStatus, ...]]]:
    for lane_id in hub.lanes.lane_ids:
        endpoint = hub.given_endpoint(lane_id)
        if isinstance(endpoint, LinkedUpstream):
            yield lane_id, endpoint.links_status()


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
                    "period_start": datetime.fromtimestamp(s.period_start_s, UTC).isoformat(),
                    "bytes_this_period": s.bytes_this_period,
                    "bytes_estimated": True,  # TCP/IP and TLS overhead estimated (edgehub.upstream.budget)
                    "cost_per_mib": s.cost_per_mib,
                    "cost_this_period": round(s.cost_this_period, 4),
                    "budget_bytes": s.budget_bytes,
                    "budget_left_bytes": s.budget_left_bytes,
                    "budget_used_percent": _MARK_LEVEL[s.budget_mark],
                    "batches": s.batches,
                    "connects": s.connects,
                }
            )
    return out or None


def format_links(links: list[dict[str, Any]] | None) -> list[str]:
    """The links as terminal lines, one per lane and link."""
    lines = []
    for k in links or []:
        budget = (
            f", budget {k['budget_left_bytes']} of {k['budget_bytes']} B left"
            + (f" (past {k['budget_used_percent']}%)" if k["budget_used_percent"] else "")
            if k["budget_bytes"] is not None
            else ""
        )
        lines.append(
            f"link {k['lane']} {k['link']}: {k['state']}, carries {k['carries_now'] or 'nothing'} "
            f"(may carry {k['priorities']}), {k['bytes_this_period']} B this period (cost {k['cost_this_period']})"
            + budget
        )
    return lines


def link_metrics(hub: EdgeHub) -> Iterator[Metric]:
    """``edgehub_link_*`` gauges per lane and link (none without links)."""
    labels = ["lane", "link"]
    # Imported at the first scrape, as metrics.py imports prometheus-client: a hub nobody scrapes does not carry it
    from prometheus_client.core import GaugeMetricFamily

    up = GaugeMetricFamily("edgehub_link_up", "1 while the link is up and settled, 0.5 settling, 0 down", labels=labels)
    sent = GaugeMetricFamily(
        "edgehub_link_period_bytes", "Bytes on the wire this period (overhead estimated)", labels=labels
    )
    cost = GaugeMetricFamily("edgehub_link_period_cost", "What this period's bytes cost", labels=labels)
    left = GaugeMetricFamily("edgehub_link_budget_left_bytes", "Bytes left in this period's budget", labels=labels)
    used = GaugeMetricFamily(
        "edgehub_link_budget_used_percent_mark", "Budget mark reached this period: 0, 80 or 100", labels=labels
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
            sent.add_metric(key, s.bytes_this_period)
            cost.add_metric(key, s.cost_this_period)
            if s.budget_left_bytes is not None:
                left.add_metric(key, s.budget_left_bytes)
                used.add_metric(key, _MARK_LEVEL[s.budget_mark])
            for p in sorted(parse_priorities(s.carries_now)) if s.carries_now else ():
                carries.add_metric([*key, str(p)], 1)
    if found:
        yield from (up, sent, cost, left, used, carries)
