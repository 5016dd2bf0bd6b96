"""``edgehub capacity``: the arithmetic of ``edgehub.runtime.capacity`` on the command line.

Usage::

    edgehub capacity --message-bytes 1000 --rate 10/s --ttl 1h [--store-bytes 2GiB] [--uplink 64kbit] [--json]
    edgehub capacity --message-bytes 1000 --rate 10/s --ttl 1h --measure     # measure the overhead here first
    edgehub capacity --message-bytes 300 --ttl 1d --links deployment.json \
        --traffic 0=0.01/s --traffic 1=0.2/s --traffic 5=5/s              # what the links cost, and an outage

Every quantity is checked before any arithmetic: a bad one is a usage error naming the flag (exit 2).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from edgehub.core import ConfigurationError
from edgehub.core.priorities import parse_priorities
from edgehub.core.units import parse_rate_bps
from edgehub.manifest import load_desired_file
from edgehub.runtime.capacity import CapacityPlan, measure_overhead, overhead_bytes, plan, wire_bytes
from edgehub.runtime.cli.limits import parse_lifetime_s, parse_store_quota
from edgehub.runtime.compose.links import link_spec
from edgehub.runtime.link_capacity import LinksPlan, links_plan

__all__ = ["capacity", "format_links_plan", "format_plan", "parse_message_rate", "parse_traffic"]

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|sec|min|m|h))?\s*$", re.IGNORECASE)
_PER = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # far beyond the MQTT head's packet limit: a typo, not a plan


def parse_message_rate(text: str) -> float:
    """``10/s``, ``600/min``, ``36000/h`` or ``10`` (a second) as messages a second."""
    m = _RATE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"not a message rate: {text!r} (try 10/s)")
    return float(m.group(1)) / _PER[(m.group(2) or "s").lower()]


def parse_traffic(items: tuple[str, ...]) -> dict[int, float]:
    """``("0=0.1/s", "5=10/s")`` as priority → messages a second; a priority given twice is refused."""
    out: dict[int, float] = {}
    for item in items:
        priority, sep, rate = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r}: write PRIORITY=RATE, e.g. 0=0.1/s")
        ps = parse_priorities(priority)
        if len(ps) != 1:
            raise ValueError(f"{item!r}: one priority per --traffic")
        (p,) = ps
        if p in out:
            raise ValueError(f"priority {p} is given twice")
        out[p] = parse_message_rate(rate)
    return out


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    if s < 172_800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86_400:.1f} d"


def format_plan(p: CapacityPlan, *, measured: bool) -> list[str]:
    """The plan as lines for a person."""
    source = "measured now" if measured else "measured, see edgehub.runtime.capacity"
    lines = [
        f"{p.message_bytes:,} B messages at {p.rate_per_s:g}/s, TTL {_duration(p.ttl_s)}:",
        f"  on disk a message takes {p.stored_bytes:,} B: {p.message_bytes:,} body and properties "
        f"+ {p.overhead_bytes} store overhead ({source}; incompressible bodies: an upper bound)",
        f"  while the uplink is down the store grows {_size(p.inflow_bytes_per_s)}/s "
        f"({_size(p.inflow_bytes_per_s * 3600)}/h)",
        f"  it holds at most {p.ttl_messages:,} messages ({_size(p.ttl_store_bytes)}): older ones expire (TTL)",
    ]
    if p.store_bytes is not None and p.fits_messages is not None:
        head = f"  a store of {_size(p.store_bytes)} fits {p.fits_messages:,} messages: "
        if p.full_after_s is None:
            lines.append(head + f"it never fills; an outage up to the TTL ({_duration(p.ttl_s)}) loses nothing")
        else:
            lines.append(
                head + f"full after {_duration(p.full_after_s)} of outage; then the overflow policy "
                f"(rejectIncoming by default); {_size(p.ttl_store_bytes)} would ride out the TTL"
            )
    needed = f"the flow needs {p.needed_bps / 1000:,.1f} kbit/s on the wire ({p.wire_bytes:,} B a message, gzip'ed)"
    if p.uplink_bps is None or p.uplink_use is None:
        lines.append(f"  {needed}")
        return lines
    uplink = f"  uplink {p.uplink_bps / 1000:,.1f} kbit/s: {needed}, {p.uplink_use:.0%} of it"
    if p.drain_s is None:
        lines.append(uplink + ": it never keeps up, the backlog only grows")
    else:
        outage = p.survives_s if p.survives_s is not None else p.ttl_s
        lines.append(uplink + f"; after a {_duration(outage)} outage it catches up in {_duration(p.drain_s)}")
    return lines


def format_links_plan(p: LinksPlan) -> list[str]:
    """The links' plan as lines for a person."""
    lines = [f"links (a message is {p.wire_bytes:,} B on the wire, gzip'ed, plus TCP/IP):"]
    for d in p.days:
        rate = f" of its {d.rate_bps / 1000:,.1f}" if d.rate_bps is not None else ""
        line = (
            f"  {d.name}: carries {d.carries or 'nothing'}; a day is {_size(d.bytes_per_day)}, "
            f"cost {d.cost_per_day:,.2f}, {d.needed_bps / 1000:,.1f}{rate} kbit/s"
        )
        if d.over_day_budget and d.day_budget_bytes is not None:
            line += f"; over its day budget ({_size(d.day_budget_bytes)})"
        if d.month_budget_bytes is not None and d.month_budget_lasts_days is not None:
            line += (
                f"; its month budget ({_size(d.month_budget_bytes)}) lasts "
                f"{d.month_budget_lasts_days:,.1f} days of this"
                + (" (not a whole month)" if d.over_month_budget else "")
            )
        lines.append(line)
    lines.append(f"  a day with every link up costs {p.cost_per_day:,.2f}")
    if p.never_leaves:
        lines.append(f"  priorities {p.never_leaves}: no link carries them, they never leave")
    lines.append(f"while {p.outage_of} is down:")
    for o in p.outage:
        line = f"  {o.name} takes {o.carries}: {_size(o.bytes_per_s * 3600)}/h, cost {o.cost_per_h:,.2f}/h"
        if o.budget_bytes is None:
            lines.append(line + "; no budget: as long as the outage lasts")
            continue
        if o.rides_out_s is None:
            line += f"; its {o.budget_period} budget ({_size(o.budget_bytes)}) is more than a day of it"
            lines.append(line + ": as long as the outage lasts")
            continue
        after = (
            f"then only {o.after_budget_carries} goes on ({o.after_budget_cost_per_h:,.2f}/h)"
            if o.after_budget_carries
            else "then nothing goes on it until the period ends"
        )
        line += (
            f"; its {o.budget_period} budget ({_size(o.budget_bytes)}) rides out {_duration(o.rides_out_s)}, {after}"
        )
        if o.budget_period != "month" and o.month_budget_lasts_days is not None:
            line += f"; its month budget lasts {o.month_budget_lasts_days:,.1f} days of this outage"
        lines.append(line)
    if p.waits_in_outage:
        lines.append(f"  priorities {p.waits_in_outage} wait in the store (their TTL running) until it is back")
    return lines


def _parsed(parse: object, text: str, flag: str) -> float:
    try:
        value = parse(text)  # type: ignore[operator]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None
    if not isinstance(value, int | float):
        raise click.BadParameter(f"{text!r} is not a value here", param_hint=flag)
    return float(value)


@click.command("capacity")
@click.option(
    "--message-bytes",
    type=click.IntRange(1, MAX_MESSAGE_BYTES),
    required=True,
    help="A message as its device sends it: body plus property names and values (what quotas count).",
)
@click.option(
    "--rate", default=None, metavar="RATE", help="Messages in, e.g. 10/s, 600/min (default: the --traffic summed)."
)
@click.option("--ttl", required=True, metavar="DURATION", help="Time to live, e.g. 3600, 12h, 7d.")
@click.option("--store-bytes", default=None, metavar="SIZE", help="Disk for the store, e.g. 2GiB.")
@click.option("--uplink", default=None, metavar="RATE", help="Uplink rate, e.g. 64kbit.")
@click.option("--measure", is_flag=True, default=False, help="Measure the store's overhead here first (a few s).")
@click.option(
    "--links",
    "links_manifest",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A manifest with upstream.links: what a day costs, and what an outage of the cheap link costs.",
)
@click.option(
    "--traffic",
    multiple=True,
    metavar="P=RATE",
    help="Messages a second at priority P (repeat it: --traffic 0=0.1/s --traffic 5=10/s); with --links.",
)
@click.option("--json", "as_json", is_flag=True, default=False, help="One JSON object instead of text.")
def capacity(
    message_bytes: int,
    rate: str | None,
    ttl: str,
    store_bytes: str | None,
    uplink: str | None,
    measure: bool,
    links_manifest: Path | None,
    traffic: tuple[str, ...],
    as_json: bool,
) -> None:
    """How many messages fit, how long an outage the store rides out, and whether the uplink catches up; with
    --links, what the links cost a day and how long the others' budgets ride out an outage of the cheap one."""
    try:
        by_priority = parse_traffic(traffic)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--traffic") from None
    if rate is None and not by_priority:
        raise click.BadParameter("give --rate, or --traffic per priority", param_hint="--rate")
    if by_priority and links_manifest is None:
        raise click.BadParameter("--traffic goes with --links", param_hint="--traffic")
    rate_per_s = _parsed(parse_message_rate, rate, "--rate") if rate is not None else sum(by_priority.values())
    links_answer = _links(links_manifest, by_priority or {10: rate_per_s}, message_bytes)
    ttl_s = _parsed(parse_lifetime_s, ttl, "--ttl")
    store = int(_parsed(parse_store_quota, store_bytes, "--store-bytes")) if store_bytes is not None else None
    uplink_bps = _parsed(parse_rate_bps, uplink, "--uplink") if uplink is not None else None
    overhead = overhead_bytes(message_bytes)
    if measure:
        m = measure_overhead(message_bytes)
        overhead = round(m.overhead_bytes)
        if not as_json:
            click.echo(
                f"measured: {m.messages:,} messages of {m.charged_bytes:,} B took {m.disk_bytes:,.1f} B each on disk "
                f"(overhead {m.overhead_bytes:.1f} B; stated {overhead_bytes(message_bytes)} B)"
            )
    p = plan(
        message_bytes=message_bytes,
        rate_per_s=rate_per_s,
        ttl_s=ttl_s,
        store_bytes=store,
        uplink_bps=uplink_bps,
        overhead=overhead,
    )
    if as_json:
        doc = p.as_dict() | ({"links": links_answer.as_dict()} if links_answer is not None else {})
        click.echo(json.dumps(doc))
        return
    for line in format_plan(p, measured=measure):
        click.echo(line)
    if links_answer is not None:
        for line in format_links_plan(links_answer):
            click.echo(line)


def _links(manifest: Path | None, traffic: dict[int, float], message_bytes: int) -> LinksPlan | None:
    if manifest is None:
        return None
    try:
        links = load_desired_file(manifest).upstream.links
    except (ConfigurationError, OSError) as exc:
        raise click.BadParameter(str(exc), param_hint="--links") from None
    if not links:
        raise click.BadParameter(f"{manifest} has no upstream.links", param_hint="--links")
    specs = [link_spec(link.model_dump()) for link in links]
    rates = {link.name: float(link.linkRateBps) for link in links if link.linkRateBps is not None}
    return links_plan(specs, traffic, wire=wire_bytes(message_bytes), rates_bps=rates)
