"""The ``edgehub`` command line."""

from __future__ import annotations

from pathlib import Path

import click

import edgehub
from edgehub.core import ConfigurationError
from edgehub.manifest import load_desired_file
from edgehub.routing import Router
from edgehub.runtime.linksim_cli import link_sim
from edgehub.runtime.routes_cli import describe_routes, routes

__all__ = ["DEFAULT_MANIFEST", "main"]

DEFAULT_MANIFEST = Path(__file__).resolve().parents[2] / "deployment" / "examples" / "default.json"


@click.group()
@click.version_option(edgehub.__version__, prog_name="edgehub")
def main() -> None:
    """edgehub: an IoT edge hub for gateways on thin, flaky uplinks."""


main.add_command(routes)
main.add_command(link_sim)


def show_routes(manifest: Path) -> None:
    """Print the version and the compiled routes of ``manifest``."""
    desired = load_desired_file(manifest)
    router = Router(desired.route_specs())
    click.echo(f"edgehub {edgehub.__version__}")
    click.echo(f"manifest: {manifest}")
    for line in describe_routes(desired.route_specs(), router, desired.time_to_live_secs):
        click.echo(f"  {line}")


@main.command()
@click.option("--manifest", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_MANIFEST)
def run(manifest: Path) -> None:
    """Start the hub. For now: print the version and the compiled routes (the protocol heads come next)."""
    try:
        show_routes(manifest)
    except ConfigurationError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    click.echo("no protocol head is built yet: nothing to serve, exiting")
