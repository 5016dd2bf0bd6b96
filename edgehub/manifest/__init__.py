"""The deployment manifest: ``$edgeHub`` desired properties (pydantic at the boundary), module twins, ACL grants."""

from edgehub.manifest.broker import ANY_IDENTITY, BrokerConfiguration, Grant, grants_of
from edgehub.manifest.deployment import EDGE_AGENT, EDGE_HUB, Deployment, parse_deployment
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
    read_manifest_file,
)
from edgehub.manifest.sections import (
    DeliveryConfiguration,
    EndpointConfiguration,
    QueuePolicyConfiguration,
    RetryPolicyConfiguration,
)

__all__ = [
    "ANY_IDENTITY",
    "DEFAULT_DUPLICATE_WINDOW_SECS",
    "DEFAULT_TTL_SECS",
    "EDGE_AGENT",
    "EDGE_HUB",
    "MAX_DEPTH",
    "MAX_MANIFEST_BYTES",
    "MAX_PARTITIONS",
    "BrokerConfiguration",
    "DeliveryConfiguration",
    "Deployment",
    "EdgeHubDesired",
    "EndpointConfiguration",
    "Grant",
    "ManifestError",
    "QueuePolicyConfiguration",
    "RetryPolicyConfiguration",
    "RouteObject",
    "StoreAndForwardConfiguration",
    "UpstreamConfiguration",
    "grants_of",
    "load_desired",
    "load_desired_file",
    "parse_deployment",
    "read_manifest_file",
]
