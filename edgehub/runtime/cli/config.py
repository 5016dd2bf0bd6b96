"""``edgehub config show``: every setting a hub started with the same flags would run with, and where each came
from (default, profile, manifest or flag); for a landing zone on S3, also what the standard AWS environment gives
its plugin (endpoint, region, where the credentials come from: ``environment``), never a secret.

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
from collections.abc import Mapping, Sequence
from typing import Any

import click

from edgehub.core import StoreError
from edgehub.manifest.documents import ManifestError, read_manifest_file
from edgehub.runtime.cli.options import GroupedCommand, grouped_options
from edgehub.runtime.cli.run import refused, run_config, run_option_groups
from edgehub.runtime.compose.config import UploadUpstreamSettings
from edgehub.runtime.compose.settings import Setting, Source, effective_settings
from edgehub.runtime.compose.store import read_metadata
from edgehub.runtime.deployment.controller import start_point_of
from edgehub.runtime.deployment.plan import DeploymentPlan, PendingCheck
from edgehub.runtime.deployment.state import STATE_KEY
from edgehub.upstream.s3env import s3_environment

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
    s3 = _s3_rows(effective.transport, plan.settings.upstream.get("links") or ())
    for line in settings_lines((deployment, *effective.table, *s3, *started.log_settings())):
        click.echo(line)


def _s3_rows(transport: object, links: Sequence[Mapping[str, Any]]) -> tuple[Setting, ...]:
    """Where an ``s3://`` landing zone's writes go and who signs them, as the standard AWS environment says (the
    hub has no S3 setting of its own: edgehub.upstream.s3env); none when nothing lands on S3."""
    urls = [transport.url] if isinstance(transport, UploadUpstreamSettings) else []
    urls += [str(link.get("url")) for link in links if link.get("transport") == "upload"]
    if not any(url.startswith(("s3://", "s3a://")) for url in urls):
        return ()
    env = s3_environment()
    if env is None:
        return (Setting("upstream.s3", "s3fs is not installed (pip install s3fs)", Source.DEFAULT),)
    return (
        Setting("upstream.s3.endpoint", f"{env.endpoint} ({env.endpoint_from})", Source.ENVIRONMENT),
        Setting("upstream.s3.region", f"{env.region} ({env.region_from})", Source.ENVIRONMENT),
        Setting("upstream.s3.credentials", f"{env.credentials} ({env.credentials_from})", Source.ENVIRONMENT),
        Setting("upstream.s3.trusts", env.trusts, Source.ENVIRONMENT),
    )
