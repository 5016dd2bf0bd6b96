"""``edgehub link-sim``: run the link simulator (``edgehub.testing.linksim``) as a standalone proxy.

Usage::

    edgehub link-sim --listen 127.0.0.1:18830 --target 127.0.0.1:1883 --rate 64kbit --delay 300ms \\
        [--jitter 20ms] [--outage 60s/300s] [--outage-mode silent|cut]

    edgehub link-sim --tc-netns edge --rate 64kbit     # root: kernel shaping, see below

Runs until interrupted (Ctrl-C). Rates as ``tc`` writes them (``64kbit``, ``2mbit``), durations as ``300ms``,
``60s``, ``5m``. ``--outage DOWN/PERIOD`` takes the link down for DOWN at the end of every PERIOD.

``--tc-netns NAME`` (root) shapes in the kernel instead of proxying: it creates network namespace NAME whose
loopback is capped at ``--rate`` by ``tc tbf`` (``edgehub.testing.tcshape``); run the hub and the broker in it
with ``ip netns exec NAME ...``. tbf has no delay, so ``--delay``/``--jitter``/``--outage`` need the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import click

from edgehub.core.units import parse_duration_s, parse_rate_bps

__all__ = ["OUTAGE_MODES", "link_sim"]

# OutageMode's values, written out: importing edgehub.testing here would load the test doubles into every
# ``edgehub`` process, ``edgehub run``'s included (tests/runtime/cli/test_linksim.py keeps the two equal).
OUTAGE_MODES = ("silent", "cut")


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"{text!r} is not HOST:PORT")
    return host or "127.0.0.1", int(port)


@click.command("link-sim")
@click.option("--listen", "listen", default=None, help="HOST:PORT to accept connections on.")
@click.option("--target", "target", default=None, help="HOST:PORT to forward to.")
@click.option("--tc-netns", "tc_netns", default=None, help="Root: shape NAME's loopback with tc tbf instead.")
@click.option("--rate", default=None, help="Rate each way, e.g. 64kbit (default: unshaped).")
@click.option("--delay", default="0ms", show_default=True, help="One-way delay, e.g. 300ms.")
@click.option("--jitter", default="0ms", show_default=True, help="Uniform jitter around the delay.")
@click.option("--outage", default=None, help="DOWN/PERIOD, e.g. 60s/300s.")
@click.option("--outage-mode", type=click.Choice(OUTAGE_MODES), default="silent", show_default=True)
def link_sim(
    listen: str | None,
    target: str | None,
    tc_netns: str | None,
    rate: str | None,
    delay: str,
    jitter: str,
    outage: str | None,
    outage_mode: str,
) -> None:
    """Run a shaped TCP link between LISTEN and TARGET (or shape a namespace's loopback with --tc-netns)."""
    from edgehub.testing.linksim import LinkSim, OutageMode  # here: only this command needs the simulator

    if tc_netns is not None:
        _run_tc(tc_netns, rate, delay, jitter, outage)
        return
    if listen is None or target is None:
        raise click.UsageError("--listen and --target are required (unless --tc-netns)")
    try:
        lhost, lport = _host_port(listen)
        thost, tport = _host_port(target)
        rate_bps = parse_rate_bps(rate) if rate else None
        delay_s, jitter_s = parse_duration_s(delay), parse_duration_s(jitter)
        outage_s: tuple[float, float] | None = None
        if outage:
            down, _, period = outage.partition("/")
            outage_s = (parse_duration_s(down), parse_duration_s(period))
        sim = LinkSim(
            target_host=thost,
            target_port=tport,
            listen_host=lhost,
            listen_port=lport,
            rate_bps=rate_bps,
            delay_s=delay_s,
            jitter_s=jitter_s,
            outage=outage_s,
            outage_mode=OutageMode(outage_mode),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    async def _run() -> None:
        async with sim:
            click.echo(f"link-sim listening on {lhost}:{sim.port} -> {thost}:{tport}", err=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run())


def _run_tc(name: str, rate: str | None, delay: str, jitter: str, outage: str | None) -> None:
    from edgehub.testing.tcshape import TbfNamespace, TcError

    if not rate:
        raise click.UsageError("--tc-netns needs --rate")
    if parse_duration_s(delay) or parse_duration_s(jitter) or outage:
        raise click.UsageError("tc tbf shapes rate only: --delay, --jitter and --outage need the proxy mode")
    try:
        rate_bps = parse_rate_bps(rate)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        with TbfNamespace(name, rate_bps=rate_bps):
            click.echo(f"link-sim: namespace {name} loopback capped at {rate}; ip netns exec {name} ...", err=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except TcError as exc:
        raise click.ClickException(str(exc)) from exc
