"""``edgehub routes check`` and ``edgehub routes test``.

MESSAGE.json for ``routes test``::

    {
      "body": "text, or any JSON value (written out as JSON)",   # or "bodyBase64": "..."
      "properties": {"alert": "yes", "nothing": null},           # application properties
      "systemProperties": {"connectionDeviceId": "dev1", "contentType": "application/json",
                           "contentEncoding": "utf-8"}
    }
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgehub.core import ConfigurationError, Message
from edgehub.routing import Router, RouteSpec

if TYPE_CHECKING:
    from edgehub.manifest import EdgeHubDesired

__all__ = ["describe_routes", "load_message", "routes"]


def _router(manifest: str) -> tuple[EdgeHubDesired, Router]:
    # Checked in process (this command only checks); imported here so that edgehub run, which imports this
    # module, does not load pydantic and the models.
    from edgehub.manifest import load_desired_file

    desired = load_desired_file(manifest)
    return desired, Router(desired.route_specs())


def describe_routes(specs: dict[str, RouteSpec], router: Router, global_ttl_s: int) -> list[str]:
    """One line per compiled route: name, priority, TTL, endpoint, route text."""
    lines = []
    for r in router.routes:
        priority = "default" if specs[r.name].priority is None else str(r.priority)
        ttl = f"{r.ttl_s}s" if r.ttl_s is not None else f"{global_ttl_s}s (global)"
        lines.append(f"{r.name}: priority={priority} ttl={ttl} endpoint={r.route.endpoint}  {r.route.text}")
    return lines


def load_message(path: str | Path) -> Message:
    """A message from the MESSAGE.json shape in this module's docstring."""
    doc: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise click.BadParameter("a message file is a JSON object", param_hint="MESSAGE")
    if "bodyBase64" in doc:
        body = base64.b64decode(doc["bodyBase64"], validate=True)
    else:
        raw = doc.get("body", "")
        body = (raw if isinstance(raw, str) else json.dumps(raw)).encode("utf-8")
    props = doc.get("properties", {})
    sysprops = doc.get("systemProperties", {})
    if not isinstance(props, dict) or not isinstance(sysprops, dict):
        raise click.BadParameter("properties and systemProperties are JSON objects", param_hint="MESSAGE")
    return Message(
        body=body,
        properties={str(k): (None if v is None else str(v)) for k, v in props.items()},
        system_properties={str(k): str(v) for k, v in sysprops.items()},
    )


@click.group()
def routes() -> None:
    """Check routes and try them on a message."""


@routes.command("check")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False))
def check(manifest: str) -> None:
    """Compile every route of MANIFEST (a deployment manifest or $edgeHub desired properties)."""
    try:
        desired, router = _router(manifest)
    except ConfigurationError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    for line in describe_routes(desired.route_specs(), router, desired.time_to_live_secs):
        click.echo(line)
    click.echo(f"ok: {len(router.routes)} routes")


@routes.command("test")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False))
@click.argument("message", type=click.Path(exists=True, dir_okay=False))
def test(manifest: str, message: str) -> None:
    """Show each route's verdict on MESSAGE and where the message would go."""
    try:
        desired, router = _router(manifest)
    except ConfigurationError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    msg = load_message(message)
    click.echo(f"message source: {msg.source}")
    for v in router.explain(msg):
        verdict = "-" if v.verdict is None else str(v.verdict)
        click.echo(f"{v.name}: {verdict}  ({v.reason})")
    results = router.route(msg)
    if not results:
        click.echo("result: not routed")
    for r in results:
        ttl = r.ttl_s if r.ttl_s is not None else f"{desired.time_to_live_secs} (global)"
        click.echo(f"result: endpoint={r.endpoint} priority={r.priority} ttl_s={ttl}")
