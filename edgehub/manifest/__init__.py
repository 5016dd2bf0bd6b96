"""The deployment manifest: ``$edgeHub`` desired properties (pydantic at the boundary)."""

from edgehub.manifest.models import (
    DEFAULT_DUPLICATE_WINDOW_SECS,
    DEFAULT_TTL_SECS,
    MAX_DEPTH,
    MAX_MANIFEST_BYTES,
    MAX_PARTITIONS,
    EdgeHubDesired,
    ManifestError,
    RouteObject,
    StoreAndForwardConfiguration,
    UpstreamConfiguration,
    load_desired,
    load_desired_file,
)

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
    "load_desired",
    "load_desired_file",
]
