"""The error tree of edgehub. Every error we raise on purpose derives from ``EdgeHubError``.

Misuse of an API (a wrong type, a negative size) raises ``ValueError``/``TypeError`` instead.
Third-party errors are translated once, in the library's home module, with ``raise ... from exc``.

::

    EdgeHubError
    ├── ConfigurationError           a route, manifest or setting is wrong (position in the message)
    │   ├── RouteError               (edgehub.routing) .line .column on every instance
    │   │   ├── RouteSyntaxError
    │   │   └── RouteCompileError
    │   ├── ManifestError            (edgehub.manifest)
    │   │   └── DeploymentCheckFailed (edgehub.runtime.deployment.plan) the child that checks a deployment failed
    │   ├── CheckpointMismatchError  (spark_upload.sink) the lake was written through another checkpoint
    │   └── SparkInternalsError      (spark_upload.spark_internals) Spark's checkpoint layout is not the one we read
    ├── IngestRejected               a message was refused at the door; .reason says why
    │   ├── QuotaExceededError       a queue or the store is full and the overflow policy rejects
    │   ├── MessageTooLargeError     over maxMessageSizeBytes
    │   └── InvalidMessageError      e.g. session id and partition key disagree
    │       ├── TwinError            a twin patch refused: .status (IoT Hub's, 400/413), .refusal (RefusalReason)
    │       └── TopicError           (protocol_heads.mqtt) a topic this identity may not publish to (MQTT 5: 0x90)
    ├── StoreError                   the store could not do what was asked
    │   ├── StorageIOError           the disk said no (ENOSPC, EIO); the store stays usable
    │   ├── StoreCorruptionError     the store on disk is damaged; .path names it (the hub will not open it)
    │   └── StoreClosedError
    ├── DeliveryError                an endpoint failed; .kind is a FailureKind
    ├── ProtocolError                a wire protocol was broken
    │   ├── LocalProtocolError       we broke it (a bug, or a send the state machine forbids)
    │   │   ├── UnsendablePacket     (protocol_heads.mqtt) a packet that can never be sent as it stands
    │   │   │   ├── PeerPacketTooLarge  a delivery over the client's Maximum Packet Size
    │   │   │   └── UnencodableField    a field MQTT cannot carry (over 65,535 bytes, not UTF-8)
    │   │   └── PeerMessageTooLarge  (protocol_heads.amqp) a delivery over the client's max-message-size on its link
    │   └── RemoteProtocolError      the peer broke it; .reason_code when the protocol has one
    │       ├── MalformedPacket      (protocol_heads.mqtt) bytes that are no MQTT packet (0x81)
    │       ├── ProtocolViolation    (protocol_heads.mqtt) a packet the protocol forbids here (0x82)
    │       └── PacketTooLarge       (protocol_heads.mqtt) over the hub's maximum packet size (0x95)
    ├── AuthError
    │   ├── AuthenticationError      who you are could not be proven
    │   ├── AuthorizationError       you may not do that
    │   └── SealedSecretError        (edgehub.core.sealing) a sealed secret did not open: another key, or altered
    ├── TransportError               an upstream transport or link failed; .kind is a FailureKind
    │   └── LandingError             (edgehub.upstream.landing) a landing zone read or write failed; .reason why
    ├── SegmentFormatError           (edgehub.upstream.segment) bytes that are no segment of a version we read
    │   └── UnknownDictionaryError   a zstd segment whose dictionary the receiver does not hold (quarantined)
    ├── LedgerFileError              (edgehub.upstream.budget) the links' budget file cannot be read; .path, .reason
    └── HadoopIOError                (spark_upload.spark_internals) a file operation through Hadoop failed; .path
"""

from __future__ import annotations

from enum import StrEnum

from edgehub.core.refusals import RefusalReason

__all__ = [
    "AuthError",
    "AuthenticationError",
    "AuthorizationError",
    "ConfigurationError",
    "DeliveryError",
    "EdgeHubError",
    "FailureKind",
    "IngestRejected",
    "InvalidMessageError",
    "LocalProtocolError",
    "MessageTooLargeError",
    "ProtocolError",
    "QuotaExceededError",
    "RemoteProtocolError",
    "SealedSecretError",
    "StorageIOError",
    "StoreClosedError",
    "StoreCorruptionError",
    "StoreError",
    "TransportError",
    "TwinError",
]


class FailureKind(StrEnum):
    """Why something failed, which decides what is done next (retry, wait, dead-letter)."""

    TRANSIENT = "transient"
    THROTTLED = "throttled"
    TIMEOUT = "timeout"
    PERMANENT = "permanent"
    INVALID_INPUT = "invalid_input"


class EdgeHubError(Exception):
    """Root of every error edgehub raises on purpose."""


class ConfigurationError(EdgeHubError):
    """A route, manifest or setting is wrong; the running configuration stays."""


class IngestRejected(EdgeHubError):
    """A message was refused at ingest; nothing was stored. ``reason`` says why (the same name in logs and
    metrics)."""

    reason: RefusalReason = RefusalReason.REJECTED

    def __init__(self, message: str, *, reason: RefusalReason | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class QuotaExceededError(IngestRejected):
    reason = RefusalReason.QUOTA_EXCEEDED


class MessageTooLargeError(IngestRejected):
    reason = RefusalReason.MESSAGE_TOO_LARGE


class InvalidMessageError(IngestRejected):
    reason = RefusalReason.INVALID_MESSAGE


class TwinError(InvalidMessageError):
    """A twin request (a reported-properties patch) was refused; nothing was changed. ``status`` is the status
    IoT Hub answers it with (400 malformed or too deep, 413 too large); ``refusal`` says why, as logged."""

    def __init__(self, message: str, *, status: int, refusal: RefusalReason) -> None:
        super().__init__(message, reason=refusal)
        self.status = status
        self.refusal = refusal


class StoreError(EdgeHubError):
    """The store could not complete an operation."""


class StorageIOError(StoreError):
    """The disk refused a write (ENOSPC, EIO). That group failed; the store stays usable."""


class StoreCorruptionError(StoreError):
    """The store's files are damaged (a checksum mismatch, a truncated log, a missing file): opening or reading
    it would lose acknowledged messages, so it is refused. ``path`` is the store's folder."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class StoreClosedError(StoreError):
    """The store was used after close."""


class DeliveryError(EdgeHubError):
    """An endpoint could not take a batch."""

    def __init__(self, message: str, *, endpoint: str, kind: FailureKind = FailureKind.TRANSIENT) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.kind = kind


class ProtocolError(EdgeHubError):
    """A wire protocol was broken."""


class LocalProtocolError(ProtocolError):
    """We were about to break the protocol (a bug, or a send the state machine forbids)."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol. ``reason_code`` is the protocol's own code, when it has one."""

    def __init__(self, message: str, *, reason_code: int | None = None) -> None:
        super().__init__(message)
        self.reason_code = reason_code


class AuthError(EdgeHubError):
    """Authentication or authorisation failed."""


class AuthenticationError(AuthError):
    """The peer's identity could not be proven."""


class AuthorizationError(AuthError):
    """The identity may not do what it asked."""


class SealedSecretError(AuthError):
    """A secret sealed at rest (``edgehub.core.sealing``) did not open: it was sealed under another key (the
    seal key file was replaced) or for another identity, or its bytes were altered."""


class TransportError(EdgeHubError):
    """An upstream transport or its link failed."""

    def __init__(self, message: str, *, kind: FailureKind = FailureKind.TRANSIENT) -> None:
        super().__init__(message)
        self.kind = kind
