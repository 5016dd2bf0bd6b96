"""A whole deployment, checked: the ``$edgeHub`` desired properties with their routes compiled, the module twins'
desired properties, the ACL grants of ``mqttBroker``, and what is accepted but not acted on.

``parse_deployment(document)`` takes a deployment manifest (``{"modulesContent": {...}}``) or the ``$edgeHub``
desired properties alone (what a twin patch from the cloud carries once merged), and gives a ``Deployment`` or
raises ``ManifestError`` whose ``errors`` list every problem with its location: the model's (unknown keys,
types, bounds) and every route's compile errors (``routes.<name>: ...``) together, so one answer tells an operator
all there is to fix.

In a deployment manifest:
* ``modulesContent.$edgeHub.properties.desired``: this hub's settings (``EdgeHubDesired``);
* ``modulesContent.$edgeAgent``: Azure IoT Edge's agent (which starts containers); edgehub starts no modules, so
  it is accepted and named in ``unsupported``;
* ``modulesContent.<module>.properties.desired``: that module's twin desired properties (free JSON), served on
  the module's twin GET and pushed to it as a patch when they change. No other key is accepted there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from edgehub.manifest.broker import Grant, grants_of
from edgehub.manifest.documents import _where, edgehub_section, refusal
from edgehub.manifest.models import EdgeHubDesired, validation_problems
from edgehub.routing import RouteError, Router

__all__ = ["EDGE_AGENT", "EDGE_HUB", "Deployment", "parse_deployment"]

EDGE_HUB = "$edgeHub"
EDGE_AGENT = "$edgeAgent"
DESIRED = "properties.desired"
MAX_MODULES = 1024
_MODULE_ID = re.compile(r"^[A-Za-z0-9\-:.+%_#*?!(),=@;$']{1,128}$")


@dataclass(frozen=True, slots=True, eq=False)
class Deployment:
    """A deployment that passed every check; applying it cannot fail on its content."""

    desired: EdgeHubDesired
    router: Router
    module_twins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # module id -> desired
    unsupported: tuple[str, ...] = ()
    grants: tuple[Grant, ...] = ()

    @property
    def version(self) -> int | None:
        return self.desired.version


def parse_deployment(document: Any) -> Deployment:
    """See the module docstring. ``ManifestError.errors`` holds every problem, each with its location."""
    section, in_manifest = edgehub_section(document)
    problems: list[str] = []
    module_twins: dict[str, Mapping[str, Any]] = {}
    unsupported: list[str] = []
    if in_manifest:
        module_twins = _module_twins(document.get("modulesContent", document), problems, unsupported)
    desired: EdgeHubDesired | None = None
    try:
        desired = EdgeHubDesired.model_validate(section)
    except ValidationError as exc:
        problems.extend(validation_problems(exc))
    # The route texts are compiled whatever else is wrong, so one answer lists their errors too.
    problems.extend(_route_problems(section))
    if problems or desired is None:
        raise refusal("deployment refused", problems)
    router = Router(desired.route_specs())  # compiled above without an error
    unsupported.extend(desired.unsupported())
    grants = grants_of(desired.mqttBroker) if desired.mqttBroker is not None and desired.schema_minor >= 2 else ()
    return Deployment(
        desired=desired,
        router=router,
        module_twins=module_twins,
        unsupported=tuple(unsupported),
        grants=grants,
    )


def _module_twins(content: Any, problems: list[str], unsupported: list[str]) -> dict[str, Mapping[str, Any]]:
    if not isinstance(content, dict):
        problems.append("modulesContent: a JSON object of modules")
        return {}
    twins: dict[str, Mapping[str, Any]] = {}
    for name, module in content.items():
        where = ("modulesContent", name)
        if name == EDGE_HUB:
            continue
        if name == EDGE_AGENT:
            unsupported.append("modulesContent.$edgeAgent (edgehub starts no modules; their twins are served)")
            continue
        if len(twins) >= MAX_MODULES:
            problems.append(f"modulesContent: more than {MAX_MODULES} modules")
            break
        if not _MODULE_ID.match(name):
            problems.append(f"{_where(where)}: not a module id (1-128 letters, digits and -:.+%_#*?!(),=@;$')")
            continue
        if not isinstance(module, dict):
            problems.append(f"{_where(where)}: a JSON object with '{DESIRED}'")
            continue
        problems.extend(f"{_where((*where, k))}: unknown key" for k in module if k != DESIRED)
        desired = module.get(DESIRED, {})
        if not isinstance(desired, dict):
            problems.append(f"{_where((*where, DESIRED))}: a JSON object")
            continue
        twins[name] = desired
    return twins


def _route_problems(section: Any) -> list[str]:
    """Every compile error of the route texts in ``section`` (a raw ``$edgeHub`` desired document)."""
    routes = section.get("routes") if isinstance(section, dict) else None
    if not isinstance(routes, dict):
        return []
    texts: dict[str, str] = {}
    for name, value in routes.items():
        text = value.get("route") if isinstance(value, dict) else value
        if isinstance(name, str) and isinstance(text, str):
            texts[name] = text
    try:
        Router(texts)
    except RouteError as exc:
        return [f"{_where(('routes', p.route_name or '?'))}: {p.message} (column {p.column})" for p in exc.problems]
    return []
