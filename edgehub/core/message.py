"""The message as the hub sees it, from ingest to delivery.

Invariants:
* ``body`` is bytes and is never decoded here; ``properties`` are the application properties (every value a
  string, or ``None`` for a property present with a null value); ``system_properties`` are strings keyed by the
  names of ``SystemProperty``.
* ``source`` is derived once, from ``messageType``, ``connectionModuleId`` and ``outputName``, as
  docs/routes.md says; it is what route sources are matched against.
* A message is immutable: ``with_system_properties`` returns a new one (the hub stamps ``edgeMessageId``
  and ``enqueuedTime`` that way).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["Message", "SystemProperty", "message_source"]


class SystemProperty(StrEnum):
    """The system property names routes can address (docs/routes.md, "Names")."""

    MESSAGE_ID = "messageId"
    TO = "to"
    CORRELATION_ID = "cid"
    USER_ID = "userId"
    ACK = "ack"
    CONNECTION_DEVICE_ID = "connectionDeviceId"
    CONNECTION_MODULE_ID = "connectionModuleId"
    CONNECTION_AUTH_METHOD = "connectionAuthMethod"
    CONTENT_TYPE = "contentType"
    CONTENT_ENCODING = "contentEncoding"
    MESSAGE_SCHEMA = "messageSchema"
    CREATION_TIME = "creationTime"
    OUTPUT_NAME = "outputName"
    INPUT_NAME = "inputName"
    MESSAGE_TYPE = "messageType"
    ABSOLUTE_EXPIRY_TIME = "absolute-expiry-time"
    OPERATION = "operation"
    INTERFACE_ID = "iothub-interface-id"
    DT_SUBJECT = "dt-subject"
    MODEL_ID = "modelId"
    ENQUEUED_TIME = "enqueuedTime"
    EDGE_MESSAGE_ID = "edgeMessageId"
    # Not addressable by routes, carried for partitioned upstreams (issue: upstream).
    SESSION_ID = "sessionId"
    PARTITION_KEY = "partitionKey"


TWIN_CHANGE_NOTIFICATION = "twinChangeNotification"


_MESSAGE_TYPE: str = SystemProperty.MESSAGE_TYPE.value  # plain str keys: a StrEnum key takes dict's slow path
_CONNECTION_MODULE_ID: str = SystemProperty.CONNECTION_MODULE_ID.value
_OUTPUT_NAME: str = SystemProperty.OUTPUT_NAME.value


def message_source(system_properties: Mapping[str, str]) -> str:
    """The routing source of a message with these system properties."""
    if system_properties.get(_MESSAGE_TYPE) == TWIN_CHANGE_NOTIFICATION:
        return "/twinChangeNotifications"
    module = system_properties.get(_CONNECTION_MODULE_ID)
    if module:
        output = system_properties.get(_OUTPUT_NAME)
        if output:
            return f"/messages/modules/{module}/outputs/{output}"
        return f"/messages/modules/{module}"
    return "/messages"


@dataclass(frozen=True, slots=True, init=False)
class Message:
    """A message: body bytes, application properties and system properties."""

    body: bytes = b""
    properties: Mapping[str, str | None] = field(default_factory=dict)
    system_properties: Mapping[str, str] = field(default_factory=dict)
    source: str = field(init=False, compare=False)

    # Written by hand, not generated: every message is built two or three times on its way through the hub, and
    # a frozen dataclass's __init__ (object.__setattr__ per field, then __post_init__) was the costliest part of
    # it. The slots' own setters (bound below the class) do the same in about half the time.
    def __init__(
        self,
        body: bytes = b"",
        properties: Mapping[str, str | None] | None = None,
        system_properties: Mapping[str, str] | None = None,
    ) -> None:
        if type(body) is not bytes and not isinstance(body, bytes):  # the exact type first: every message
            if not isinstance(body, bytearray | memoryview):
                raise TypeError(f"body must be bytes, not {type(body).__name__}")
            body = bytes(body)
        if system_properties is None:
            system_properties = {}
        _set_body(self, body)
        _set_properties(self, {} if properties is None else properties)
        _set_system_properties(self, system_properties)
        _set_source(self, message_source(system_properties))

    @property
    def message_id(self) -> str | None:
        return self.system_properties.get(SystemProperty.MESSAGE_ID)

    @property
    def edge_message_id(self) -> str | None:
        return self.system_properties.get(SystemProperty.EDGE_MESSAGE_ID)

    def with_system_properties(self, **updates: str) -> Message:
        """A copy with these system properties set (keys are the ``SystemProperty`` names)."""
        merged = dict(self.system_properties)
        merged.update(updates)
        return Message(body=self.body, properties=self.properties, system_properties=merged)

    def size_bytes(self, *, leaving_out: Container[str] = ()) -> int:
        """Body plus property names and values, in UTF-8: what quotas and maxMessageSizeBytes count.
        ``leaving_out``: system properties not counted (the store's own stamps, for one)."""
        # An ASCII string's UTF-8 length is its length (checked in C, without encoding it).
        n = len(self.body)
        for k, v in self.properties.items():
            n += len(k) if k.isascii() else len(k.encode())
            if v is not None:
                n += len(v) if v.isascii() else len(v.encode())
        for k, v in self.system_properties.items():  # the keys are SystemProperty names: ASCII
            if k not in leaving_out:
                n += len(k) + (len(v) if v.isascii() else len(v.encode()))
        return n


_set_body = Message.__dict__["body"].__set__
_set_properties = Message.__dict__["properties"].__set__
_set_system_properties = Message.__dict__["system_properties"].__set__
_set_source = Message.__dict__["source"].__set__
