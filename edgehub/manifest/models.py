"""The ``$edgeHub`` desired properties, validated at the boundary with pydantic (its one home).

Accepted documents: a full deployment manifest (``modulesContent.$edgeHub.properties.desired``), the modules'
part alone (``{"$edgeHub": {"properties.desired": ...}}``, as Azure's documentation shows it) or the desired
properties alone. Every object refuses a key it does not know, at every level
(``storeAndForwardConfiguration.maxQueueByts: unknown key``), and one ``ManifestError`` lists every problem
(``errors``). Rules
(ROUTE_LANGUAGE.md, "Routes in the manifest"; ``deployment/DEPLOYMENT.md`` for every key):

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
  segment codec of ``batch`` mode). Credentials and TLS files are not here: desired
  properties are no place for secrets (see ``edgehub run --help``). Unknown keys there are refused (a typo
  must not silently leave detection off), and values must have their JSON type (``"4"`` is not a partition
  count).

Errors are ``ManifestError`` (a ConfigurationError) naming the field; route text errors stay RouteErrors here
(``edgehub.manifest.deployment`` turns them into located ManifestError lines with the rest).

Bounds, checked before pydantic sees the document (a refusal with a location, never a RecursionError, a
ValueError or a UnicodeError): a manifest file is at most ``MAX_MANIFEST_BYTES`` of UTF-8; a document nests
at most ``MAX_DEPTH`` levels (Azure IoT Hub allows twins 10 levels deep, and deeper JSON sends Python's parser
and pydantic's serializer into their recursion limits); every string in it is valid Unicode (a lone
surrogate escape such as ``"\\ud800"`` is JSON but cannot be written out as UTF-8: a queue named by it would
fail in the store).
"""

from __future__ import annotations

import json
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

from edgehub.core import ConfigurationError
from edgehub.manifest.broker import BrokerConfiguration
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
MAX_PARTITIONS = 64
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_ROUTES = 1024
MAX_ENDPOINTS = 1024
MAX_ERRORS = 100  # a document with more problems lists the first ones (and says how many more)
_LONG_INTEGER = re.compile(r"[0-9]{4000,}")  # int() refuses more than 4,300 digits (sys.get_int_max_str_digits)
_SCHEMA = re.compile(r"^1\.([0-3])(?:\.0)?$")
_ROUTE_NAME = re.compile(r"^[^\.\$# ]+$")


class ManifestError(ConfigurationError):
    """A manifest that cannot be applied; the running configuration stays. ``errors`` lists every problem found,
    each ``location: what`` (``storeAndForwardConfiguration.maxQueueByts: unknown key``)."""

    def __init__(self, message: str, errors: tuple[str, ...] | None = None) -> None:
        super().__init__(message)
        self.errors: tuple[str, ...] = errors if errors is not None else (message,)


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


def _where(path: tuple[str | int, ...]) -> str:
    # Escaped: a name that is not valid Unicode must not make the error itself unprintable.
    shown = ".".join(str(p).encode("utf-8", "backslashreplace").decode("utf-8") for p in path[:8])
    return (shown + ".…" if len(path) > 8 else shown) or "(top)"


def _check_document(document: Any) -> None:
    """ManifestError naming the first value nested deeper than MAX_DEPTH or the first string that is not valid
    Unicode. Iterative: a document of any depth is walked without recursion."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise ManifestError(f"{_where(path)}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and not _is_unicode(k):
                    raise ManifestError(f"{_where((*path, k))}: the name is not valid Unicode (a lone surrogate)")
                stack.append((v, (*path, k)))
        elif isinstance(value, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(value))
        elif isinstance(value, str) and not _is_unicode(value):
            raise ManifestError(f"{_where(path)}: the string is not valid Unicode (a lone surrogate)")


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _line_column(text: str, pos: int) -> tuple[int, int]:
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _too_deep_at(text: str) -> int:
    """Where ``text`` first opens more than MAX_DEPTH brackets (strings skipped), or 0."""
    depth = 0
    for m in re.finditer(r'"(?:\\.|[^"\\])*"|[\[\]{}]', text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return m.start()
        elif c in "]}":
            depth -= 1
    return 0


def validation_problems(exc: ValidationError) -> list[str]:
    """Every problem pydantic found, ``location: what``; an unknown key reads ``unknown key``."""
    out = []
    for e in exc.errors(include_url=False):
        loc = tuple(e["loc"])
        if len(loc) > 2 and loc[0] == "routes" and loc[2] in ("text", "object"):
            loc = loc[:2] + loc[3:]  # the union's tag, not a key of the document
        loc = tuple(p for p in loc if p != "[key]")  # pydantic's mark of a bad key: the path names the key
        if e["type"] == "extra_forbidden":
            what = "unknown key"
        elif e["type"] == "missing":
            what = "required key missing"
        else:
            what = str(e["msg"]).removeprefix("Value error, ")
        out.append(f"{_where(loc)}: {what}")
    return out


def edgehub_section(document: Any) -> tuple[Any, bool]:
    """The ``$edgeHub`` desired properties of a deployment manifest (``{"modulesContent": {...}}``, or the modules
    alone: ``{"$edgeHub": ..., "<module>": ...}``) and True, or the document itself when it is the desired
    properties alone, and False. Errors name paths within the desired properties."""
    if not isinstance(document, dict):
        raise ManifestError(f"(top): a manifest is a JSON object, not {type(document).__name__}")
    _check_document(document)
    content = document.get("modulesContent")
    if content is None and "$edgeHub" in document:
        content = document  # the modules' part alone, as Azure's documentation shows deployments
    if content is None:
        return document, False
    try:
        return content["$edgeHub"]["properties.desired"], True
    except (KeyError, TypeError) as exc:
        raise ManifestError("deployment manifest has no modulesContent.$edgeHub.properties.desired") from exc


def load_desired(document: Any) -> EdgeHubDesired:
    """The ``$edgeHub`` desired properties of a deployment manifest or of the properties alone; ``ManifestError``
    listing every problem (``errors``) with its location."""
    desired, _ = edgehub_section(document)
    try:
        return EdgeHubDesired.model_validate(desired)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise refusal("invalid $edgeHub desired properties", problems) from exc


def refusal(what: str, problems: list[str]) -> ManifestError:
    """One ManifestError for ``problems`` (at most ``MAX_ERRORS`` of them listed)."""
    shown = problems[:MAX_ERRORS]
    if len(problems) > MAX_ERRORS:
        shown.append(f"(and {len(problems) - MAX_ERRORS} more)")
    return ManifestError(f"{what}: {'; '.join(shown)}", tuple(shown))


def read_manifest_file(path: str | Path) -> Any:
    """A manifest file's JSON document (bounded in size and depth, UTF-8); ``ManifestError`` with the position."""
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc.strerror}") from exc
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: over the limit of {MAX_MANIFEST_BYTES} bytes for a manifest")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ManifestError(f"{path}: not UTF-8 at line {line}, column {column} (byte {exc.start})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from exc
    except RecursionError:
        # Deeper than Python's parser goes (about 1,000 levels); _check_document refuses what is less deep.
        line, column = _line_column(text, _too_deep_at(text))
        raise ManifestError(f"{path}: nested deeper than {MAX_DEPTH} levels at line {line}, column {column}") from None
    except ValueError as exc:  # an integer of more digits than int() converts
        m = _LONG_INTEGER.search(text)
        where = " at line {}, column {}".format(*_line_column(text, m.start())) if m else ""
        raise ManifestError(f"{path}: not JSON this hub reads{where}: {exc}") from exc


def load_desired_file(path: str | Path) -> EdgeHubDesired:
    """Read and validate a manifest file."""
    return load_desired(read_manifest_file(path))
