"""An ACL grant of the manifest's ``mqttBroker`` section (``edgehub.manifest.broker`` makes them), with no pydantic:
the serving hub gets its grants from the manifest check (``edgehub.runtime.deployment.check``) and applies them
to running connections (``edgehub.runtime.deployment.state.LiveGrants``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from edgehub.core import Identity

__all__ = ["ANY_IDENTITY", "VARIABLE", "Grant"]

ANY_IDENTITY = "{{iot:identity}}"
VARIABLE = re.compile(r"\{\{([^{}]*)\}\}")  # {{iot:identity}} and its kind, in a resource


@dataclass(frozen=True, slots=True)
class Grant:
    """One allowed operation on one topic filter, for one identity id or (``identity`` None) for every one."""

    identity: str | None
    operation: Literal["publish", "subscribe"]
    resource: str  # a topic filter, perhaps with variables

    def applies_to(self, identity: Identity) -> bool:
        if self.identity is not None and self.identity != identity.id:
            return False
        return identity.module_id is not None or "{{iot:module_id}}" not in self.resource

    def topic_filter(self, identity: Identity) -> str:
        """The resource with the variables filled from ``identity`` (call only when ``applies_to``)."""
        values = {
            "iot:identity": identity.id,
            "iot:device_id": identity.device_id,
            "iot:module_id": identity.module_id or "",
            "mqtt:client_id": identity.id,
        }
        return VARIABLE.sub(lambda m: values[m.group(1)], self.resource)
