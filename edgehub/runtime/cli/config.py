"""``edgehub config show``: every setting a hub started with the same flags would run with, and where each came
from (default, profile, manifest or flag).

It takes ``edgehub run``'s flags (the same option groups) and builds the hub's config with the same function
(``run_config``); the manifest is checked as ``run`` checks it (in a child process) and laid over the config by
``effective_settings``, the function ``serve`` runs with. So what it shows is what ``run`` uses, and cannot drift.

It starts nothing, opens no store and writes nothing in the data directory; a manifest that does not pass its check
is refused as ``run`` refuses it (its problems one a line, exit 1).
"""

from __future__ import annotations

import asyncio
from typing import Any

import click

from edgehub.manifest.documents import ManifestError, read_manifest_file
from edgehub.runtime.cli.options import GroupedCommand, grouped_options
from edgehub.runtime.cli.run import refused, run_config, run_option_groups
from edgehub.runtime.compose.settings import Setting, effective_settings
from edgehub.runtime.deployment.plan import DeploymentPlan, PendingCheck

__all__ = ["config", "settings_lines"]


@click.group()
def config() -> None:
    """The settings a hub runs with, and where each came from."""


async def _checked(document: Any) -> DeploymentPlan:
    pending = await PendingCheck.start(document)
    try:
        return await pending.answer()
    finally:
        await pending.close()


def settings_lines(rows: tuple[Setting, ...]) -> list[str]:
    """One aligned line per setting: name, value, source."""
    name_width = max(len(row.name) for row in rows)
    value_width = min(max(len(row.value) for row in rows), 40)  # a longer value pushes only its own source
    return [f"{row.name:<{name_width}}  {row.value:<{value_width}}  {row.source}" for row in rows]


@grouped_options(run_option_groups())
@config.command(cls=GroupedCommand)
@click.pass_context
def show(ctx: click.Context, /, **params: Any) -> None:
    """Print every setting edgehub run would use with the same flags, and its source: default, profile
    (--profile), manifest (--manifest) or flag (the command line, or the flag's environment variable)."""
    started = run_config(ctx, params)
    manifest = started.hub.manifest
    try:
        plan = asyncio.run(_checked(read_manifest_file(manifest)))
    except ManifestError as exc:
        refused(manifest, exc)
    effective = effective_settings(started.hub, plan.settings)
    for line in settings_lines((*effective.table, *started.log_settings())):
        click.echo(line)
