"""The deployment manifest: ``$edgeHub`` desired properties (pydantic at the boundary)."""

from edgehub.manifest.models import (
    DEFAULT_TTL_SECS,
    EdgeHubDesired,
    ManifestError,
    RouteObject,
    StoreAndForwardConfiguration,
    load_desired,
    load_desired_file,
)

__all__ = [
    "DEFAULT_TTL_SECS",
    "EdgeHubDesired",
    "ManifestError",
    "RouteObject",
    "StoreAndForwardConfiguration",
    "load_desired",
    "load_desired_file",
]
