"""``InMemoryDesiredState``: a complete desired-state service (``edgehub.runtime.admin.api.DesiredStateService``)
for tests of what drives a deployment (the admin API), without the hub's ``DeploymentController``.

It keeps the desired properties and the reported ones the way the controller does: an update is checked whole
and applied whole or refused whole; ``$version`` is taken from the update (a PATCH's, else the desired
document's) or counted up; the reported properties carry ``lastDesiredVersion`` and ``lastDesiredStatus``.
What it refuses is steerable: ``refuse_keys`` (top-level keys it refuses, each error naming its path),
``gate`` (an event an update waits on before it applies: a test holds an update in flight).

Every update is recorded in ``updates`` as ``(kind, document, source)``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from edgehub.hub.twins import merged

__all__ = ["InMemoryDesiredState", "Status"]


@dataclass(frozen=True, slots=True)
class Status:
    """A ``DesiredStatus``: 200 applied, 400 refused with every error."""

    code: int
    description: str
    errors: tuple[str, ...] = ()
    version: int | None = None


@dataclass
class InMemoryDesiredState:
    desired: dict[str, Any] = field(default_factory=dict)
    refuse_keys: set[str] = field(default_factory=set)
    gate: asyncio.Event | None = None
    updates: list[tuple[str, dict[str, object], str]] = field(default_factory=list)
    _version: int = 0
    _last: Status = field(default_factory=lambda: Status(200, "no update yet"))

    def reported(self) -> dict[str, object]:
        return {
            "lastDesiredVersion": self._version,
            "lastDesiredStatus": {"code": self._last.code, "description": self._last.description},
            "desired": dict(self.desired),
        }

    async def put_desired(self, desired: dict[str, object], *, source: str) -> Status:
        self.updates.append(("put", desired, source))
        return await self._apply(dict(desired))

    async def patch_desired(self, patch: dict[str, object], *, source: str) -> Status:
        self.updates.append(("patch", patch, source))
        candidate = merged(self.desired, patch)
        if "$version" in patch:
            candidate["$version"] = patch["$version"]
        return await self._apply(candidate)

    async def _apply(self, candidate: dict[str, Any]) -> Status:
        if self.gate is not None:
            await self.gate.wait()
        version = candidate.get("$version")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            status = Status(400, "refused", ("$version: must be an integer",), None)
            self._last = status
            return status
        errors = tuple(f"{key}: refused by the test" for key in sorted(self.refuse_keys & set(candidate)))
        new_version = version if version is not None else self._version + 1
        if errors:
            status = Status(400, "refused", errors, new_version)
        else:
            self.desired = candidate
            self._version = new_version
            status = Status(200, "applied", (), new_version)
        self._last = status
        return status
