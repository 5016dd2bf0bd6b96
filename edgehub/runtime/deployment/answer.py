"""The manifest check's answer (``CheckAnswer``: a ``DeploymentPlan`` or every error) as plain values: written by the
check's process (``edgehub.runtime.deployment.check``), read by the serving hub (``edgehub.runtime.deployment.plan``,
which decodes it into these types with msgspec). Imports neither pydantic nor lark nor the store."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from edgehub.manifest.documents import MAX_MANIFEST_BYTES
from edgehub.manifest.grants import Grant
from edgehub.runtime.deployment.wants import DesiredSettings

__all__ = ["MAX_DOCUMENT_BYTES", "CheckAnswer", "DeploymentPlan", "PlannedRoute", "encode_answer"]

MAX_DOCUMENT_BYTES = 8 * MAX_MANIFEST_BYTES  # as JSON with every non-ASCII character escaped


@dataclass(frozen=True, slots=True)
class PlannedRoute:
    name: str
    text: str
    priority: int | None
    time_to_live_secs: int | None
    tree: dict[str, Any]  # edgehub.routing.wire


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentPlan:
    """A deployment that passed the check, as plain values (see the module docstring)."""

    routes: list[PlannedRoute]
    settings: DesiredSettings
    module_twins: dict[str, dict[str, Any]] = field(default_factory=dict)  # module id -> desired
    unsupported: list[str] = field(default_factory=list)  # of the $edgeHub desired properties
    module_unsupported: list[str] = field(default_factory=list)  # of modulesContent ($edgeAgent)
    grants: list[Grant] = field(default_factory=list)

    def section_only(self) -> DeploymentPlan:
        """The plan of this deployment's ``$edgeHub`` desired properties alone (no modules)."""
        return replace(self, module_twins={}, module_unsupported=[])


@dataclass(frozen=True, slots=True)
class CheckAnswer:
    errors: list[str]  # empty: accepted, and ``plan`` is set
    plan: DeploymentPlan | None = None


def encode_answer(answer: CheckAnswer) -> bytes:
    # The stdlib's JSON (ASCII, escaped): a string literal of a route may hold a lone surrogate ('\uD800'), which
    # UTF-8 cannot carry.
    return json.dumps(asdict(answer)).encode("ascii")
