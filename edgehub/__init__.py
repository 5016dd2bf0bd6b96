"""edgehub: an IoT edge hub for gateways on thin, flaky uplinks."""

from edgehub.core.message import Message

__all__ = ["Message", "__version__"]

__version__ = "0.1.0"
