"""Azure IoT Edge's ``mqttBroker`` section (``$edgeHub`` schema 1.2 and 1.3) and the ACL grants it makes.

Shape, as Azure IoT Edge reads it (``BrokerProperties``, ``AuthorizationProperties``, ``BridgeConfig`` in
Azure/iotedge ``edge-hub/core/src/Microsoft.Azure.Devices.Edge.Hub.Core/config``)::

    "mqttBroker": {
      "authorizations": [{"identities": ["{{iot:identity}}"],
                          "allow": [{"operations": ["mqtt:publish"], "resources": ["alerts/{{iot:identity}}"]}],
                          "deny": [...]}],
      "bridges": [{"endpoint": "$upstream", "settings": [{"direction": "in|out|both", "topic": "...",
                   "inPrefix": "...", "outPrefix": "..."}]}]
    }

What edgehub does with it:
* ``allow`` rules become grants (``Grant``): ``mqtt:publish`` and ``mqtt:subscribe`` on plain MQTT topic filters,
  for the identities named or every identity (``{{iot:identity}}``). An identity is written as Azure's
  documentation writes it, ``<hub host>/<device>`` or ``<hub host>/<device>/<module>`` (the host is dropped: one
  hub, one namespace), or as edgehub's client ids, ``<device>`` or ``<device>/<module>``; two parts whose first
  holds a ``.`` are read as host and device (write a device id with a ``.`` with its host). The
  variables ``{{iot:identity}}``, ``{{iot:device_id}}``, ``{{iot:module_id}}`` and ``{{mqtt:client_id}}`` in a
  resource are the connected identity's (``grant.topic_filter(identity)``); a grant with ``{{iot:module_id}}``
  does not apply to a device. ``mqtt:connect`` is accepted: every authenticated identity may connect anyway.
  The grants add to the built-in IoT Hub topics every identity has (``protocol_heads.mqtt.iothub.Acl``).
* ``deny`` rules are refused: grants only add, so a deny could only be honoured by changing what Azure's
  first-match order means; a manifest that relies on one is told so rather than half obeyed.
* ``bridges`` are accepted and not acted on (edgehub's upstream is ``$upstream`` through the routes): they are
  named in the reported properties' ``unsupported``.

Invariants: at most ``MAX_STATEMENTS`` statements and ``MAX_RULES`` rules each; a resource is a valid MQTT
topic filter once its variables are filled (``#`` only last, ``+`` and ``#`` alone in their level).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from edgehub.manifest.grants import ANY_IDENTITY, VARIABLE, Grant

__all__ = ["ANY_IDENTITY", "BrokerConfiguration", "Grant", "grants_of", "identity_id"]

MAX_STATEMENTS = 256
MAX_RULES = 64
MAX_ITEMS = 256
_KNOWN_VARIABLES = {"iot:identity", "iot:device_id", "iot:module_id", "mqtt:client_id"}
_ID_PART = re.compile(r"^[A-Za-z0-9\-.%_*?!(),:=@$'+#;]{1,128}$")
Operation = Literal["mqtt:connect", "mqtt:publish", "mqtt:subscribe"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Rule(_Strict):
    operations: list[Operation] = Field(min_length=1, max_length=3)
    resources: list[StrictStr] = Field(default_factory=list, max_length=MAX_ITEMS)

    @field_validator("resources")
    @classmethod
    def _resources_are_filters(cls, v: list[str]) -> list[str]:
        for r in v:
            problem = _filter_problem(r)
            if problem:
                raise ValueError(f"resource {r!r}: {problem}")
        return v


class Statement(_Strict):
    identities: list[StrictStr] = Field(min_length=1, max_length=MAX_ITEMS)
    allow: list[Rule] = Field(default_factory=list, max_length=MAX_RULES)
    deny: list[Rule] = Field(default_factory=list, max_length=MAX_RULES)

    @field_validator("identities")
    @classmethod
    def _identities(cls, v: list[str]) -> list[str]:
        bad = [i for i in v if i != ANY_IDENTITY and identity_id(i) is None]
        if bad:
            raise ValueError(
                f"{bad[:3]} are not identities: '<host>/<device>', '<host>/<device>/<module>', '<device>', "
                f"'<device>/<module>' or '{ANY_IDENTITY}'"
            )
        return v

    @field_validator("deny")
    @classmethod
    def _no_deny(cls, v: list[Rule]) -> list[Rule]:
        if v:
            raise ValueError("deny rules are not supported by edgehub (grants only add to the built-in topics)")
        return v


class BridgeSettings(_Strict):
    direction: Literal["in", "out", "both"]
    topic: StrictStr
    inPrefix: StrictStr = ""
    outPrefix: StrictStr = ""


class Bridge(_Strict):
    endpoint: StrictStr
    settings: list[BridgeSettings] = Field(max_length=MAX_ITEMS)


class BrokerConfiguration(_Strict):
    authorizations: list[Statement] = Field(default_factory=list, max_length=MAX_STATEMENTS)
    bridges: list[Bridge] = Field(default_factory=list, max_length=MAX_ITEMS)


def grants_of(broker: BrokerConfiguration) -> tuple[Grant, ...]:
    """The grants of the ``allow`` rules, in the manifest's order (``mqtt:connect`` makes none)."""
    out: list[Grant] = []
    for statement in broker.authorizations:
        for who in statement.identities:
            identity = None if who == ANY_IDENTITY else identity_id(who)
            for rule in statement.allow:
                for op in rule.operations:
                    if op == "mqtt:connect":
                        continue
                    kind: Literal["publish", "subscribe"] = "publish" if op == "mqtt:publish" else "subscribe"
                    out.extend(Grant(identity, kind, r) for r in rule.resources)
    return tuple(out)


def identity_id(written: str) -> str | None:
    """The identity id (``device`` or ``device/module``) an authorization statement names, or None."""
    parts = written.split("/")
    if len(parts) == 3 or (len(parts) == 2 and "." in parts[0]):
        parts = parts[1:]  # Azure's "<hub host>/<device>[/<module>]"
    if not 1 <= len(parts) <= 2 or not all(_ID_PART.match(p) for p in parts):
        return None
    return "/".join(parts)


def _filter_problem(resource: str) -> str | None:
    if not resource or len(resource) > 1024:
        return "a topic filter of 1 to 1024 characters"
    unknown = [v for v in VARIABLE.findall(resource) if v not in _KNOWN_VARIABLES]
    if unknown:
        return f"unknown variable {{{{{unknown[0]}}}}} (known: {', '.join(sorted(_KNOWN_VARIABLES))})"
    levels = VARIABLE.sub("x", resource).split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return "'#' must be a whole level, and the last"
        if "+" in level and level != "+":
            return "'+' must be a whole level"
        if "\x00" in level:
            return "no NUL characters"
    return None
