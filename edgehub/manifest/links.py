"""``upstream.links``: several uplinks for the hub, each with its transport, address, credentials (named, never
given: the environment variable or file that holds them), link hints, cost, budget and the priorities it may
carry (``docs/links.md``; ``edgehub.upstream.links`` chooses between them).

Invariants: every key is known, typed and bounded like the rest of the manifest; a link names its secrets by
environment variable or file only (desired properties are reported back and are no place for a password); names
are unique; a budget has a period, and a link has at most one budget per period (``budget`` is one object or a
list of one or two with different periods: a day and a month); an upload link has no MQTT key, and a key file
comes with its certificate file (a key taken must do something); a link carries at least one priority, and the
priorities it may send past its budgets are among them. That every routed priority has a link is the whole
document's check (``uncarried_routes``), as it needs the routes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    field_validator,
    model_validator,
)

from edgehub.core.priorities import format_priorities, parse_priorities
from edgehub.core.routes import DEFAULT_PRIORITY

__all__ = [
    "BUDGET_TAGS",
    "MAX_LINKS",
    "BudgetConfiguration",
    "LinkConfiguration",
    "check_links",
    "uncarried_routes",
]

MAX_LINKS = 8
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_ADDRESS = re.compile(r"^[^\s:]{1,253}:[0-9]{1,5}$")
Number = StrictInt | StrictFloat
# The keys only an MQTT link uses (an upload link takes url, maxUplinkBps and the keys of every link).
_MQTT_ONLY = (
    "clientId",
    "protocol",
    "username",
    "passwordEnv",
    "passwordFile",
    "sasTokenEnv",
    "sasTokenFile",
    "tls",
    "caFile",
    "certFile",
    "keyFile",
    "keepaliveSecs",
    "ackTimeoutSecs",
    "linkRateBps",
    "linkRttMs",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BudgetConfiguration(_Strict):
    """Bytes a link may send per period; the period starts at ``startHourUtc`` (each day, or the first of the
    month)."""

    bytes: StrictInt = Field(ge=1, le=2**50, description="bytes on the wire per period")
    period: Literal["day", "month"] = Field(description="required: a budget without a period means nothing")
    startHourUtc: StrictInt = Field(default=0, ge=0, le=23)


# ``budget``: one object (the form of before) or a list of one or two. The union's tags are not keys of the document
# (``edgehub.manifest.models.validation_problems`` drops them from a problem's path).
BUDGET_TAGS = ("object", "list")
Budgets = Annotated[
    Annotated[BudgetConfiguration, Tag("object")]
    | Annotated[list[BudgetConfiguration], Tag("list"), Field(min_length=1, max_length=2)],
    Discriminator(lambda v: "list" if isinstance(v, list) else "object"),
]


class LinkConfiguration(_Strict):
    name: StrictStr = Field(description="unique; letters, digits, '-' and '_', at most 32")
    transport: Literal["mqtt", "upload"] = "mqtt"
    address: StrictStr | None = Field(default=None, max_length=300, description="mqtt: host:port")
    url: StrictStr | None = Field(default=None, max_length=2048, description="upload: a folder or fsspec URL")
    clientId: StrictStr | None = Field(default=None, min_length=1, max_length=128)
    protocol: Literal["3.1.1", "5"] | None = None
    username: StrictStr | None = Field(default=None, max_length=256)
    passwordEnv: StrictStr | None = Field(default=None, max_length=128)
    passwordFile: StrictStr | None = Field(default=None, max_length=4096)
    sasTokenEnv: StrictStr | None = Field(default=None, max_length=128)
    sasTokenFile: StrictStr | None = Field(default=None, max_length=4096)
    tls: StrictBool = False
    caFile: StrictStr | None = Field(default=None, max_length=4096)
    certFile: StrictStr | None = Field(default=None, max_length=4096)
    keyFile: StrictStr | None = Field(default=None, max_length=4096)
    keepaliveSecs: StrictInt | None = Field(default=None, ge=1, le=3600)
    ackTimeoutSecs: Number | None = Field(default=None, ge=0.5, le=600)
    linkRateBps: StrictInt | None = Field(default=None, ge=1_000)
    linkRttMs: StrictInt | None = Field(default=None, ge=0, le=60_000)
    maxUplinkBps: StrictInt | None = Field(default=None, ge=1_000)
    costPerMiB: Number = Field(default=0, ge=0, le=1_000_000)
    budget: Budgets | None = Field(default=None, description="one budget, or a day and a month budget (a list)")
    priorities: StrictStr = Field(default=f"0-{DEFAULT_PRIORITY}", description="what it may carry: '0-2', '0,1,5'")
    allowedOverBudget: StrictStr | None = Field(default=None, description="priorities that go on past the budget")
    settleSecs: Number = Field(default=10, ge=0, le=3600, description="up this long before it is preferred again")

    @field_validator("budget")
    @classmethod
    def _one_budget_per_period(
        cls, v: BudgetConfiguration | list[BudgetConfiguration] | None
    ) -> BudgetConfiguration | list[BudgetConfiguration] | None:
        if isinstance(v, list):
            seen: dict[str, int] = {}
            for i, b in enumerate(v):
                if b.period in seen:
                    raise ValueError(
                        f"budget[{i}].period {b.period!r} is the period of budget[{seen[b.period]}] too: "
                        "at most one budget a day and one a month"
                    )
                seen[b.period] = i
        return v

    @property
    def budgets(self) -> list[BudgetConfiguration]:
        """The link's budgets as a list, whichever form the manifest gave (none: no budget)."""
        if self.budget is None:
            return []
        return list(self.budget) if isinstance(self.budget, list) else [self.budget]

    @model_validator(mode="after")
    def _consistent(self) -> LinkConfiguration:
        if not _NAME.match(self.name):
            raise ValueError(f"link name {self.name!r}: letters, digits, '-' and '_', 1 to 32 of them")
        if self.transport == "mqtt":
            if self.address is None or not _ADDRESS.match(self.address):
                raise ValueError(f"link {self.name!r}: an mqtt link needs address 'host:port'")
            if self.url is not None:
                raise ValueError(f"link {self.name!r}: url is for upload links")
        else:
            if self.url is None or self.address is not None:
                raise ValueError(f"link {self.name!r}: an upload link needs url, and no address")
            # an upload link writes files: an MQTT key would be taken and do nothing
            mqtt_only = sorted(key for key in _MQTT_ONLY if getattr(self, key) not in (None, False))
            if mqtt_only:
                raise ValueError(f"link {self.name!r}: {', '.join(mqtt_only)} only for mqtt links")
        if self.keyFile is not None and self.certFile is None:
            raise ValueError(f"link {self.name!r}: keyFile is the key of certFile, which is not given")
        for env, file in ((self.passwordEnv, self.passwordFile), (self.sasTokenEnv, self.sasTokenFile)):
            if env is not None and file is not None:
                raise ValueError(f"link {self.name!r}: a secret comes from the environment or a file, not both")
        carried = parse_priorities(self.priorities)
        if self.allowedOverBudget is not None:
            over = parse_priorities(self.allowedOverBudget)
            if not over <= carried:
                raise ValueError(
                    f"link {self.name!r}: allowedOverBudget {format_priorities(over - carried)} "
                    f"is not among its priorities {self.priorities}"
                )
            if self.budget is None:
                raise ValueError(f"link {self.name!r}: allowedOverBudget without a budget")
        return self

    @property
    def carried(self) -> frozenset[int]:
        return parse_priorities(self.priorities)


def check_links(links: Sequence[LinkConfiguration] | None) -> Sequence[LinkConfiguration] | None:
    """``links`` when their names are unique; ``ValueError`` naming the first name used twice."""
    if links is None:
        return None
    if not links:
        raise ValueError("links: give at least one link, or leave links out for the single upstream")
    seen: dict[str, int] = {}
    for i, link in enumerate(links):
        if link.name in seen:
            raise ValueError(f"links[{i}].name {link.name!r} is the name of links[{seen[link.name]}] too")
        seen[link.name] = i
    return links


def uncarried_routes(
    links: Sequence[LinkConfiguration], routes: Mapping[str, tuple[str, int | None]]
) -> list[tuple[str, int]]:
    """``(route name, priority)`` of each route to ``$upstream`` whose priority no link carries: its messages
    could never leave. ``routes``: name → (route text, priority or None for the default)."""
    carried = frozenset().union(*(link.carried for link in links))
    out = []
    for name, (text, priority) in routes.items():
        p = DEFAULT_PRIORITY if priority is None else priority
        if "$upstream" in text and p not in carried:
            out.append((name, p))
    return out
