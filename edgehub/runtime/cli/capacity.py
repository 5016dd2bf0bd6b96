"""``edgehub capacity``: the arithmetic of ``edgehub.runtime.capacity`` on the command line.

Usage::

    edgehub capacity --message-bytes 1000 --rate 10/s --ttl 1h [--store-bytes 2GiB] [--uplink 64kbit] [--json]
    edgehub capacity --message-bytes 1000 --rate 10/s --ttl 1h --measure     # measure the overhead here first

Every quantity is checked before any arithmetic: a bad one is a usage error naming the flag (exit 2).
"""

from __future__ import annotations

import json
import re

import click

from edgehub.core.units import parse_rate_bps
from edgehub.runtime.capacity import CapacityPlan, measure_overhead, overhead_bytes, plan
from edgehub.runtime.cli.limits import parse_lifetime_s, parse_store_quota

__all__ = ["capacity", "format_plan", "parse_message_rate"]

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|sec|min|m|h))?\s*$", re.IGNORECASE)
_PER = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # far beyond the MQTT head's packet limit: a typo, not a plan


def parse_message_rate(text: str) -> float:
    """``10/s``, ``600/min``, ``36000/h`` or ``10`` (a second) as messages a second."""
    m = _RATE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"not a message rate: {text!r} (try 10/s)")
    return float(m.group(1)) / _PER[(m.group(2) or "s").lower()]


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
@click.option("--rate", required=True, metavar="RATE", help="Messages in, e.g. 10/s, 600/min.")
@click.option("--ttl", required=True, metavar="DURATION", help="Time to live, e.g. 3600, 12h, 7d.")
@click.option("--store-bytes", default=None, metavar="SIZE", help="Disk for the store, e.g. 2GiB.")
@click.option("--uplink", default=None, metavar="RATE", help="Uplink rate, e.g. 64kbit.")
@click.option("--measure", is_flag=True, default=False, help="Measure the store's overhead here first (a few s).")
@click.option("--json", "as_json", is_flag=True, default=False, help="One JSON object instead of text.")
def capacity(
    message_bytes: int,
    rate: str,
    ttl: str,
    store_bytes: str | None,
    uplink: str | None,
    measure: bool,
    as_json: bool,
) -> None:
    """How many messages fit, how long an outage the store rides out, and whether the uplink catches up."""
    rate_per_s = _parsed(parse_message_rate, rate, "--rate")
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
        click.echo(json.dumps(p.as_dict()))
        return
    for line in format_plan(p, measured=measure):
        click.echo(line)
