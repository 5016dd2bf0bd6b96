"""The core of edgehub: values every layer shares. Standard library only."""

from edgehub.core.clock import Clock, SystemClock, utc_from_epoch
from edgehub.core.errors import (
    AuthenticationError,
    AuthError,
    AuthorizationError,
    ConfigurationError,
    DeliveryError,
    EdgeHubError,
    FailureKind,
    IngestRejected,
    InvalidMessageError,
    LocalProtocolError,
    MessageTooLargeError,
    ProtocolError,
    QuotaExceededError,
    RemoteProtocolError,
    StorageIOError,
    StoreClosedError,
    StoreError,
    TransportError,
)
from edgehub.core.identity import DeviceId, Identity, ModuleId
from edgehub.core.message import Message, SystemProperty, message_source
from edgehub.core.routes import DEFAULT_PRIORITY, RouteResult

__all__ = [
    "DEFAULT_PRIORITY",
    "AuthError",
    "AuthenticationError",
    "AuthorizationError",
    "Clock",
    "ConfigurationError",
    "DeliveryError",
    "DeviceId",
    "EdgeHubError",
    "FailureKind",
    "Identity",
    "IngestRejected",
    "InvalidMessageError",
    "LocalProtocolError",
    "Message",
    "MessageTooLargeError",
    "ModuleId",
    "ProtocolError",
    "QuotaExceededError",
    "RemoteProtocolError",
    "RouteResult",
    "StorageIOError",
    "StoreClosedError",
    "StoreError",
    "SystemClock",
    "SystemProperty",
    "TransportError",
    "message_source",
    "utc_from_epoch",
]
