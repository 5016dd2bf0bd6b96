"""How ``edgehub run`` serves once its options are read: the event loop it runs on (uvloop by default), the
garbage collector's tuning, the lines it prints as it comes up (certificates, ports, how to connect), systemd's
notifications and signals, and which start failures are the user's to fix (a message) rather than bugs (a
traceback). ``edgehub.runtime.cli`` parses the options; ``edgehub.runtime.compose.serve.serve`` composes the hub.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgehub.core import ConfigurationError, StoreError
from edgehub.runtime.certs import HubCerts
from edgehub.runtime.cli.firstrun import connect_help_for, edgehub_command
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.serve import serve
from edgehub.runtime.deployment.plan import DeploymentPlan
from edgehub.runtime.sdnotify import SystemdNotifier

__all__ = ["GC_THRESHOLDS", "loop_factory", "serve_until_signalled", "start_failures", "tune_gc"]


def loop_factory(name: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The event loop ``edgehub run`` serves on (the name of the one it got, and its factory). uvloop by default
    (its transports, handles and timers are C: less CPU per message, docs/performance.md, "Where the speed comes
    from"); ``asyncio`` is the fallback where uvloop is not installed (it has no Windows build)."""
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            click.echo("edgehub: uvloop is not installed; serving on the asyncio event loop", err=True)
        else:
            return "uvloop", uvloop.new_event_loop
    return "asyncio", asyncio.new_event_loop


GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """Fewer, cheaper cyclic collections for a long-running hub: what is loaded at start (some 10^5 objects of
    imported modules) is frozen out of every collection, and a young collection runs every 50,000 container
    allocations instead of 700. Garbage without cycles is freed at once whatever the thresholds; what closed
    connections leave in cycles is collected after churn (``edgehub.runtime.memory``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


_START_FAILURES = (ConfigurationError, StoreError, OSError)


def start_failures(exc: Exception) -> list[str] | None:
    """What to tell the user when ``exc`` is one of the failures a start can meet (a port already taken, a
    locked store), also when the task groups of the head and the executors wrapped them; None for anything
    else, which is a bug and keeps its traceback."""
    if not isinstance(exc, ExceptionGroup):
        return [str(exc)]
    expected, rest = exc.split(_START_FAILURES)
    if expected is None or rest is not None:
        return None
    leaves: list[str] = []
    stack: list[BaseException] = [expected]
    while stack:
        e = stack.pop()
        if isinstance(e, BaseExceptionGroup):
            stack.extend(reversed(e.exceptions))
        else:
            leaves.append(str(e))
    return leaves


async def serve_until_signalled(
    config: HubConfig, *, document: Any = None, on_checked: Callable[[DeploymentPlan], None] | None = None
) -> None:
    """Serve ``config`` until SIGTERM or SIGINT, printing how to connect once ready (and telling systemd).
    ``document``: the manifest file's, when the caller read it; ``on_checked`` is called with its plan."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    systemd = SystemdNotifier.from_environment()  # READY=1, WATCHDOG=1, STOPPING=1 under Type=notify

    def stopping() -> None:
        if not stop.is_set():
            systemd.stopping()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping)

    ca_pems: list[Path] = []

    def certs(c: HubCerts) -> None:
        verb = "created" if c.created else "using"
        click.echo(f"{verb} TLS certificates in {c.ca_pem.parent}; clients trust {c.ca_pem}")
        ca_pems.append(c.ca_pem)

    def ready(ports: dict[str, int]) -> None:
        admin = ports.pop("admin", None)
        # MQTT's listeners first (scripts read "listening: tls HOST:PORT"), then AMQP's.
        order = sorted(ports.items(), key=lambda item: (item[0].startswith("amqp"), item[0]))
        where = ", ".join(f"{kind} {config.host}:{port}" for kind, port in order)
        click.echo(f"listening: {where}", nl=True)
        if admin is not None:
            click.echo(f"admin API: http://127.0.0.1:{admin} (bearer token in {config.data_dir / 'admin.token'})")
        click.echo(f"store: {config.data_dir / 'store'}; ready")
        help_lines = connect_help_for(config, ports, ca_pems[0], edgehub=edgehub_command())
        for line in help_lines:
            click.echo(line)
        sys.stdout.flush()
        systemd.ready(f"listening: {where}")

    async with systemd.watchdog():
        await serve(config, stop=stop, on_certs=certs, on_ready=ready, on_checked=on_checked, document=document)
