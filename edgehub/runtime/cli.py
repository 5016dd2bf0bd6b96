"""The ``edgehub`` command line."""

from __future__ import annotations

import click

import edgehub
from edgehub.runtime.linksim_cli import link_sim

__all__ = ["main"]


@click.group()
@click.version_option(edgehub.__version__, prog_name="edgehub")
def main() -> None:
    """edgehub: an IoT edge hub for gateways on thin, flaky uplinks."""


@main.command()
def run() -> None:
    """Start the hub on its embedded defaults."""
    click.echo(f"edgehub {edgehub.__version__}")


main.add_command(link_sim)
