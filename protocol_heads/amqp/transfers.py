"""A telemetry transfer's bytes to the hub's message, decoding what is new only: one per connection.

An AMQP message is a run of sections; telemetry's body is its last, ``data`` (or an ``amqp-value`` holding binary,
as proton's clients send bytes), and what comes before it
(header, annotations, properties, application properties) is often the same bytes transfer after transfer (a
client that sets no message id). The sections before the body are found without decoding them (each is one value
whose constructor gives its size); when they are the bytes of the last message mapped on this connection, the
message is that one's properties and system properties with the new body, as the MQTT head reuses a known topic's.
Anything else is decoded in full (``proton_raw.MessageReader``) and mapped (``iothub.message_from_amqp``).

Invariants:
* The same hub message (or the same ``InvalidMessageError``) as decoding in full: the mapping is a function of
  the bytes, the identity and the auth method, and only a message that mapped without error is kept, with its
  identity and auth method. ``tests/protocol_heads/amqp/test_transfers.py`` pins it.
* Bounded: one message's sections, at most ``MAX_KEPT_PREFIX`` bytes, per connection.
"""

from __future__ import annotations

from edgehub.core import Identity, Message
from protocol_heads.amqp.iothub import message_from_amqp
from protocol_heads.amqp.proton_raw import MessageReader

__all__ = ["MAX_KEPT_PREFIX", "TransferDecoder", "data_body"]

MAX_KEPT_PREFIX = 1024

_SECTION = 0x00, 0x53  # a section's descriptor: described type, smallulong code
_BEFORE_BODY = frozenset((0x70, 0x71, 0x72, 0x73, 0x74))  # header, annotations (2), properties, app properties
_BODY = frozenset((0x75, 0x77))  # data; amqp-value (proton's Message writes a bytes body so, unless inferred)
_FIXED = {0x40: 0, 0x50: 1, 0x60: 2, 0x70: 4, 0x80: 8, 0x90: 16}  # constructor's high nibble → value width
_SIZE1 = frozenset((0xA0, 0xC0, 0xE0))  # variable, compound, array with a one-byte size
_SIZE4 = frozenset((0xB0, 0xD0, 0xF0))  # ... with a four-byte size


def _value_end(data: bytes, at: int) -> int:
    """Where the value whose constructor is at ``at`` ends; -1 for a described or unknown constructor."""
    kind = data[at] & 0xF0
    width = _FIXED.get(kind)
    if width is not None:
        return at + 1 + width
    if kind in _SIZE1 and at + 2 <= len(data):
        return at + 2 + data[at + 1]
    if kind in _SIZE4 and at + 5 <= len(data):
        return at + 5 + int.from_bytes(data[at + 1 : at + 5], "big")
    return -1


def data_body(encoded: bytes) -> tuple[int, bytes] | None:
    """``(where the body's section starts, the body)`` for a message whose sections before its body (one ``data``
    section, or an ``amqp-value`` of binary) are header, annotations or properties, each a value of known size,
    and which ends with its body; None for any other message (another body, a footer, two data sections, a
    descriptor by name)."""
    at, n = 0, len(encoded)
    while at + 4 <= n:
        if (encoded[at], encoded[at + 1]) != _SECTION:
            return None
        code, value = encoded[at + 2], at + 3
        if code in _BODY:  # a binary in either: the same body bytes to the mapping
            constructor = encoded[value]
            if constructor == 0xA0 and value + 2 <= n:
                start, size = value + 2, encoded[value + 1]
            elif constructor == 0xB0 and value + 5 <= n:
                start, size = value + 5, int.from_bytes(encoded[value + 1 : value + 5], "big")
            else:
                return None
            return (at, encoded[start:]) if start + size == n else None
        if code not in _BEFORE_BODY:
            return None
        end = _value_end(encoded, value)
        if end < 0 or end > n:
            return None
        at = end
    return None


class TransferDecoder:
    """One connection's: ``message`` maps a transfer's bytes (module docstring)."""

    def __init__(self) -> None:
        self._reader = MessageReader()
        self._prefix = b""  # the sections before the body of the last message mapped in full
        self._kept: tuple[Identity, str, Message] | None = None

    def message(self, identity: Identity, encoded: bytes, *, auth_method: str) -> Message:
        """Raises ``InvalidMessageError`` for what the hub cannot carry, proton's errors for bytes that are not a
        message."""
        split = data_body(encoded)
        kept = self._kept
        if split is not None and kept is not None:
            at, body = split
            if kept[0] == identity and kept[1] == auth_method and encoded[:at] == self._prefix:
                return Message(body, kept[2].properties, kept[2].system_properties)
        message = message_from_amqp(identity, self._reader.read(encoded), auth_method=auth_method)
        if split is not None and split[0] <= MAX_KEPT_PREFIX:
            self._prefix = encoded[: split[0]]
            self._kept = (identity, auth_method, message)
        return message
