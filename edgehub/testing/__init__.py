"""Steerable collaborators for tests, shipped with the package (after bytewax's ``testing``).

Each one is a complete implementation of the seam it stands in for, never a mock: a manual clock, endpoints
that fail, stall or revive, an in-memory hub facade, a link that can be cut, a store backend that holds syncs.
"""

from edgehub.testing.backends import GatedBackend
from edgehub.testing.clock import ManualClock
from edgehub.testing.endpoints import GatedTestEndpoint, NullEndpoint, PipelinedTestEndpoint, TestEndpoint
from edgehub.testing.hub import InMemoryHub
from edgehub.testing.links import RecordingLink

__all__ = [
    "GatedBackend",
    "GatedTestEndpoint",
    "InMemoryHub",
    "ManualClock",
    "NullEndpoint",
    "PipelinedTestEndpoint",
    "RecordingLink",
    "TestEndpoint",
]
