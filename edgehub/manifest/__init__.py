"""The deployment manifest: ``$edgeHub`` desired properties (pydantic at the boundary), module twins, ACL grants.

The names below are loaded when first used, not with the package: ``edgehub.manifest.documents`` (reading a
manifest within its bounds, ``ManifestError``) and ``edgehub.manifest.grants`` need no pydantic, and a serving hub
imports only those (its manifests are checked in a child process, ``edgehub.runtime.deployment.check``: pydantic
and the models are ~10 MB of a small gateway's memory). ``from edgehub.manifest import EdgeHubDesired`` loads
the models as before.
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:
    from edgehub.manifest.broker import BrokerConfiguration, grants_of
    from edgehub.manifest.deployment import EDGE_AGENT, EDGE_HUB, Deployment, parse_deployment
    from edgehub.manifest.documents import (
        MAX_DEPTH,
        MAX_MANIFEST_BYTES,
        MAX_PARTITIONS,
        ManifestError,
        read_manifest_file,
    )
    from edgehub.manifest.grants import ANY_IDENTITY, Grant
    from edgehub.manifest.models import (
        DEFAULT_DUPLICATE_WINDOW_SECS,
        DEFAULT_TTL_SECS,
        EdgeHubDesired,
        RouteObject,
        StoreAndForwardConfiguration,
        UpstreamConfiguration,
        load_desired,
        load_desired_file,
    )
    from edgehub.manifest.sections import (
        DeliveryConfiguration,
        EndpointConfiguration,
        QueuePolicyConfiguration,
        RetryPolicyConfiguration,
    )

_HOMES = {
    "ANY_IDENTITY": "grants",
    "Grant": "grants",
    "BrokerConfiguration": "broker",
    "grants_of": "broker",
    "EDGE_AGENT": "deployment",
    "EDGE_HUB": "deployment",
    "Deployment": "deployment",
    "parse_deployment": "deployment",
    "MAX_DEPTH": "documents",
    "MAX_MANIFEST_BYTES": "documents",
    "ManifestError": "documents",
    "read_manifest_file": "documents",
    "DEFAULT_DUPLICATE_WINDOW_SECS": "models",
    "DEFAULT_TTL_SECS": "models",
    "MAX_PARTITIONS": "documents",
    "EdgeHubDesired": "models",
    "RouteObject": "models",
    "StoreAndForwardConfiguration": "models",
    "UpstreamConfiguration": "models",
    "load_desired": "models",
    "load_desired_file": "models",
    "DeliveryConfiguration": "sections",
    "EndpointConfiguration": "sections",
    "QueuePolicyConfiguration": "sections",
    "RetryPolicyConfiguration": "sections",
}

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
]  # the names of _HOMES (tests/manifest/test_package.py keeps them equal)


def __getattr__(name: str) -> typing.Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'edgehub.manifest' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"edgehub.manifest.{home}"), name)
    globals()[name] = value  # once: later lookups do not come here
    return value
