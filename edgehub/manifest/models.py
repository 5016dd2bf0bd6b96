"""The ``$edgeHub`` desired properties, validated at the boundary with pydantic (its one home).

Accepted documents: a full deployment manifest (``modulesContent.$edgeHub.properties.desired``), the modules'
part alone (``{"$edgeHub": {"properties.desired": ...}}``, as Azure's documentation shows it) or the desired
properties alone. Every object refuses a key it does not know, at every level
(``storeAndForwardConfiguration.maxQueueByts: unknown key``), and one ``ManifestError`` lists every problem
(``errors``). Rules
(``docs/routes.md``, "Priority and time-to-live"; ``docs/manifest.md`` for every key):

* ``schemaVersion``: major 1, minor 0-3, written ``"1.1"`` or ``"1.1.0"``; ``"1"`` and ``"2.0"`` are refused.
* ``routes``: name → route string; from schema 1.1 also ``{"route", "priority" 0-9, "timeToLiveSecs"}``.
  Route names match ``^[^\\.\\$# ]+$``.
* ``storeAndForwardConfiguration.timeToLiveSecs``: the global TTL (default 7200 s, as Azure IoT Edge); the
  section's other keys, ``delivery`` and ``endpoints`` are edgehub's (``edgehub.manifest.sections``);
  ``mqttBroker`` is Azure's (``edgehub.manifest.broker``); ``integrity``, Azure 1.3's signed deployments, is
  accepted and not verified (``EdgeHubDesired.unsupported`` names it); ``$version`` and ``$metadata`` are a
  twin's bookkeeping.
* ``upstream`` (edgehub's own, not Azure IoT Edge's): ``partitions`` 1-64 (default 1: one lane, ``$upstream``),
  ``duplicateDetection`` (default false) and ``duplicateDetectionWindowSecs`` 1-604800 (default 600, as
  Service Bus's default; at most 7 days as Service Bus allows); and how the upstream uses its link, each unset
  by default (unset: the transport's default; the command line's flag overrides either): ``wireMode``
  (``"batch"`` or ``"message"``), ``maxUplinkBps`` (a cap on upstream bits per second), ``maxBatchBytes`` (wire
  bytes per batch), ``lingerMs`` (how long a short batch may wait to fill while others are in flight),
  ``maxInflightBytes`` (the window of unacknowledged bytes), ``linkRateBps`` / ``linkRttMs`` (the link hints
  the default window and batch size are computed from), ``compression`` (``"gzip"`` or ``"zstd"``, the
  segment codec of ``batch`` mode), ``maxPacketBytes`` (the largest MQTT packet taken from the broker, 1024 to
  268435460, MQTT's own limit), ``brokerMaxPacketBytes`` (the largest the broker takes, for one that does not
  announce it, as no MQTT 3.1.1 broker does; same bounds). Credentials and TLS files are not here: desired
  properties are no place for secrets (see ``edgehub run --help``). Unknown keys there are refused (a typo
  must not silently leave detection off), and values must have their JSON type (``"4"`` is not a partition
  count).

Errors are ``ManifestError`` (a ConfigurationError) naming the field; route text errors stay RouteErrors here
(``edgehub.manifest.deployment`` turns them into located ManifestError lines with the rest).

Bounds (size, depth, valid Unicode) are checked before pydantic sees the document, in
``edgehub.manifest.documents`` (which needs no pydantic: a serving hub reads manifests with it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from edgehub.manifest.broker import BrokerConfiguration
from edgehub.manifest.documents import (
    MAX_DEPTH,
    MAX_MANIFEST_BYTES,
    MAX_PARTITIONS,
    ManifestError,
    _where,
    edgehub_section,
    read_manifest_file,
    refusal,
)
from edgehub.manifest.links import BUDGET_TAGS, MAX_LINKS, LinkConfiguration, check_links, uncarried_routes
from edgehub.manifest.sections import (
    DEFAULT_TTL_SECS,
    DeliveryConfiguration,
    EndpointConfiguration,
    EndpointId,
    StoreAndForwardConfiguration,
)
from edgehub.routing import RouteSpec

__all__ = [
    "DEFAULT_DUPLICATE_WINDOW_SECS",
    "DEFAULT_TTL_SECS",
    "MAX_DEPTH",
    "MAX_MANIFEST_BYTES",
    "MAX_PARTITIONS",
    "EdgeHubDesired",
    "ManifestError",
    "RouteObject",
    "StoreAndForwardConfiguration",
    "UpstreamConfiguration",
    "edgehub_section",
    "load_desired",
    "load_desired_file",
    "read_manifest_file",
    "refusal",
    "validation_problems",
]

DEFAULT_DUPLICATE_WINDOW_SECS = 600
MAX_ROUTES = 1024
MAX_ENDPOINTS = 1024
_SCHEMA = re.compile(r"^1\.([0-3])(?:\.0)?$")
_ROUTE_NAME = re.compile(r"^[^\.\$# ]+$")


class RouteObject(BaseModel):
    model_config = ConfigDict(extra="forbid")

    route: StrictStr
    priority: StrictInt | None = Field(default=None, ge=0, le=9)
    timeToLiveSecs: StrictInt | None = Field(default=None, ge=0, le=4_294_967_295)


def _route_name(name: str) -> str:
    if not _ROUTE_NAME.match(name):
        raise ValueError(f"route name {name!r} must not be empty or contain '.', '$', '#' or spaces")
    return name


RouteName = Annotated[str, AfterValidator(_route_name)]

# A route is its text or (schema 1.1 on) an object; the tag keeps errors at ``routes.<name>.<key>``.
RouteValue = Annotated[
    Annotated[StrictStr, Tag("text")] | Annotated[RouteObject, Tag("object")],
    Discriminator(lambda v: "text" if isinstance(v, str) else "object"),
]


class UpstreamConfiguration(BaseModel):
    """``upstream``: partitioned lanes and duplicate detection (after Service Bus partitioned queues)."""

    model_config = ConfigDict(extra="forbid")

    partitions: StrictInt = Field(default=1, ge=1, le=MAX_PARTITIONS)
    duplicateDetection: StrictBool = False
    duplicateDetectionWindowSecs: StrictInt = Field(default=DEFAULT_DUPLICATE_WINDOW_SECS, ge=1, le=604_800)
    # The link: None leaves the transport's default (or the command line's value).
    wireMode: Literal["batch", "message"] | None = None
    maxUplinkBps: StrictInt | None = Field(default=None, ge=1_000)
    maxBatchBytes: StrictInt | None = Field(default=None, ge=256, le=16_777_216)
    lingerMs: StrictInt | None = Field(default=None, ge=0, le=60_000)
    maxInflightBytes: StrictInt | None = Field(default=None, ge=512, le=1_073_741_824)
    linkRateBps: StrictInt | None = Field(default=None, ge=1_000)
    linkRttMs: StrictInt | None = Field(default=None, ge=0, le=60_000)
    compression: Literal["gzip", "zstd"] | None = None
    # The transport's bounds (edgehub.upstream.mqtt.settings, which this layer does not import; a test keeps them
    # equal): a twin document or a method call must fit, and MQTT cannot say more.
    maxPacketBytes: StrictInt | None = Field(default=None, ge=1024, le=268_435_460)
    brokerMaxPacketBytes: StrictInt | None = Field(default=None, ge=1024, le=268_435_460)
    # Several uplinks, chosen per batch by cost, budget and priority (edgehub.manifest.links; docs/links.md).
    links: list[LinkConfiguration] | None = Field(default=None, max_length=MAX_LINKS)

    @field_validator("links")
    @classmethod
    def _unique_links(cls, v: list[LinkConfiguration] | None) -> list[LinkConfiguration] | None:
        check_links(v)
        return v


class IntegrityHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    signercert: list[StrictStr] = Field(default_factory=list, max_length=64)
    intermediatecacert: list[StrictStr] = Field(default_factory=list, max_length=64)


class IntegritySignature(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bytes: StrictStr
    algorithm: StrictStr


class Integrity(BaseModel):
    """Azure IoT Edge 1.3's signed deployments: accepted, not verified (named in ``unsupported``)."""

    model_config = ConfigDict(extra="forbid")

    header: IntegrityHeader
    signature: IntegritySignature


class EdgeHubDesired(BaseModel):
    """The ``$edgeHub`` desired properties: Azure IoT Edge's schema 1.0-1.3 and edgehub's own sections. A key
    that is neither is refused, naming its path."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schemaVersion: StrictStr
    routes: dict[RouteName, RouteValue] = Field(default_factory=dict, max_length=MAX_ROUTES)
    storeAndForwardConfiguration: StoreAndForwardConfiguration = Field(default_factory=StoreAndForwardConfiguration)
    mqttBroker: BrokerConfiguration | None = None
    integrity: Integrity | None = None
    upstream: UpstreamConfiguration = Field(default_factory=UpstreamConfiguration)
    delivery: DeliveryConfiguration = Field(default_factory=DeliveryConfiguration)
    endpoints: dict[EndpointId, EndpointConfiguration] = Field(default_factory=dict, max_length=MAX_ENDPOINTS)
    # A twin's bookkeeping, as IoT Hub sends desired properties: the version is the document's; metadata is not.
    version: StrictInt | None = Field(default=None, alias="$version", ge=0)
    metadata: dict[str, Any] | None = Field(default=None, alias="$metadata")

    @field_validator("schemaVersion")
    @classmethod
    def _schema_version(cls, v: str) -> str:
        if not _SCHEMA.match(v):
            raise ValueError(f"schemaVersion {v!r} is not supported: major 1, minor 0-3 (e.g. '1.1')")
        return v

    @model_validator(mode="after")
    def _objects_need_schema_1_1(self) -> EdgeHubDesired:
        if self.schema_minor == 0:
            objects = [n for n, r in self.routes.items() if isinstance(r, RouteObject)]
            if objects:
                raise ValueError(f"routes {objects} are objects, which need schemaVersion 1.1 or later")
        return self

    @model_validator(mode="after")
    def _every_upstream_priority_has_a_link(self) -> EdgeHubDesired:
        links = self.upstream.links
        if links:
            specs = self.route_specs()
            lost = uncarried_routes(links, {n: (r.route, r.priority) for n, r in specs.items()})
            if lost:
                named = ", ".join(f"routes.{n} (priority {p})" for n, p in lost)
                raise ValueError(f"{named}: no link in upstream.links carries that priority, so it could never leave")
        return self

    @property
    def schema_minor(self) -> int:
        m = _SCHEMA.match(self.schemaVersion)
        return int(m.group(1)) if m else 0

    @property
    def time_to_live_secs(self) -> int:
        return self.storeAndForwardConfiguration.timeToLiveSecs

    def unsupported(self) -> list[str]:
        """The parts of Azure IoT Edge's schema given here that edgehub accepts but does not act on."""
        out = []
        if self.mqttBroker is not None:
            if self.schema_minor < 2:
                out.append("mqttBroker (needs schemaVersion 1.2; ignored, as Azure IoT Edge ignores it)")
            elif self.mqttBroker.bridges:
                out.append("mqttBroker.bridges (edgehub sends upstream through routes to $upstream)")
        if self.integrity is not None:
            out.append("integrity (the deployment's signature is not verified)")
        return out

    def route_specs(self) -> dict[str, RouteSpec]:
        """The routes as the router takes them."""
        out = {}
        for name, r in self.routes.items():
            if isinstance(r, str):
                out[name] = RouteSpec(route=r)
            else:
                out[name] = RouteSpec(route=r.route, priority=r.priority, time_to_live_secs=r.timeToLiveSecs)
        return out


def validation_problems(exc: ValidationError) -> list[str]:
    """Every problem pydantic found, ``location: what``; an unknown key reads ``unknown key``."""
    out = []
    for e in exc.errors(include_url=False):
        loc = tuple(e["loc"])
        if len(loc) > 2 and loc[0] == "routes" and loc[2] in ("text", "object"):
            loc = loc[:2] + loc[3:]  # the union's tag, not a key of the document
        if "budget" in loc[:-1] and loc[loc.index("budget") + 1] in BUDGET_TAGS:
            i = loc.index("budget") + 1
            loc = loc[:i] + loc[i + 1 :]  # a link budget's form (one object or a list), not a key either
        loc = tuple(p for p in loc if p != "[key]")  # pydantic's mark of a bad key: the path names the key
        if e["type"] == "extra_forbidden":
            what = "unknown key"
        elif e["type"] == "missing":
            what = "required key missing"
        else:
            what = str(e["msg"]).removeprefix("Value error, ")
        out.append(f"{_where(loc)}: {what}")
    return out


def load_desired(document: Any) -> EdgeHubDesired:
    """The ``$edgeHub`` desired properties of a deployment manifest or of the properties alone; ``ManifestError``
    listing every problem (``errors``) with its location."""
    desired, _ = edgehub_section(document)
    try:
        return EdgeHubDesired.model_validate(desired)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise refusal("invalid $edgeHub desired properties", problems) from exc


def load_desired_file(path: str | Path) -> EdgeHubDesired:
    """Read and validate a manifest file."""
    return load_desired(read_manifest_file(path))
