"""The ``edgehub`` command group.

``run`` (``edgehub.runtime.cli.run``), ``routes`` and ``sas-token`` are imported with this module; the other
commands (capacity, config, identity, link-sim, status, deadletter, store) are imported when named
(``_Commands``): a serving hub never runs them and does not carry their modules (measured: about 0.3 MB of the
idle hub's RSS).
"""

from __future__ import annotations

import importlib
import os
from typing import ClassVar

import click

import edgehub
from edgehub.runtime.cli.firstrun import sas_token
from edgehub.runtime.cli.routes import routes
from edgehub.runtime.cli.run import DEFAULT_MANIFEST, run
from edgehub.runtime.data_dir import private_umask

__all__ = ["DEFAULT_MANIFEST", "main"]


class _Commands(click.Group):
    """The command group, with the commands a serving hub never runs imported when named (module docstring)."""

    lazy: ClassVar[dict[str, tuple[str, str]]] = {  # command name -> (module, attribute): the one list of them
        "capacity": ("edgehub.runtime.cli.capacity", "capacity"),
        "config": ("edgehub.runtime.cli.config", "config"),
        "deadletter": ("edgehub.runtime.cli.status", "deadletter"),
        "identity": ("edgehub.runtime.cli.identity", "identity"),
        "link-sim": ("edgehub.runtime.cli.linksim", "link_sim"),
        "status": ("edgehub.runtime.cli.status", "status"),
        "store": ("edgehub.runtime.cli.store", "store"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module, attribute = self.lazy[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands)
@click.version_option(edgehub.__version__, prog_name="edgehub")
@click.pass_context
def main(ctx: click.Context) -> None:
    """edgehub: an IoT edge hub for gateways on thin, flaky uplinks."""
    # Every command may create files in the data directory (RocksDB's among them, made with RocksDB's own modes):
    # umask 077 makes them private from their first byte (data_dir.py). Given back when the command ends, for a
    # program that runs commands in process (click's test runner).
    previous = private_umask()
    ctx.call_on_close(lambda: os.umask(previous))


main.add_command(routes)
main.add_command(sas_token)
main.add_command(run)
