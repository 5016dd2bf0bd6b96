"""``edgehub config show``: every setting a hub started with the same flags would run with, and where each came
from (default, profile, manifest or flag).

It takes ``edgehub run``'s flags (the same option groups) and builds the hub's config with the same function
(``run_config``); the manifest is checked as ``run`` checks it (in a child process) and laid over the config by
``effective_settings``, the function ``serve`` runs with. So what it shows is what ``run`` uses, and cannot drift.

It starts nothing and writes nothing in the data directory; it reads the deployment the store kept (read-only, so a
running hub may hold the store), because a start runs that one while the manifest file is unchanged since it was
last read (``edgehub.runtime.deployment.controller.start_point``), and says which it shows. A manifest that does
not pass its check is refused as ``run`` refuses it (its problems one a line, exit 1).
"""

from __future__ import annotations

import asyncio
from typing import Any

import click

from edgehub.core import StoreError
from edgehub.manifest.documents import ManifestError, read_manifest_file
from edgehub.runtime.cli.options import GroupedCommand, grouped_options
from edgehub.runtime.cli.run import refused, run_config, run_option_groups
from edgehub.runtime.compose.settings import Setting, Source, effective_settings
from edgehub.runtime.compose.store import read_metadata
from edgehub.runtime.deployment.controller import start_point_of
from edgehub.runtime.deployment.plan import DeploymentPlan, PendingCheck
from edgehub.runtime.deployment.state import STATE_KEY

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
        document = read_manifest_file(manifest)
        # What the next start runs: the file, or the deployment the store kept (the rule of precedence at start)
        point = start_point_of(read_metadata(started.hub.data_dir, STATE_KEY), manifest, document)
        plan = point.plan or asyncio.run(_checked(point.document))
    except ManifestError as exc:
        refused(manifest, exc)
    except StoreError as exc:
        click.echo(f"edgehub: cannot read the deployment kept in {started.hub.data_dir}: {exc}", err=True)
        raise SystemExit(1) from None
    effective = effective_settings(started.hub, plan.settings)
    # Which deployment: the file's, or the one a patch (admin API, cloud) or an earlier file left in the store.
    kept = "" if point.document is document else " (kept in the store; the manifest file is unchanged since)"
    deployment = Setting("deployment", f"{point.source}{kept}", Source.MANIFEST)
    for line in settings_lines((deployment, *effective.table, *started.log_settings())):
        click.echo(line)
