"""MQTT's variable byte integer (MQTT 5.0 section 1.5.5, 3.1.1 section 2.2.3): the one encoder, used by the codec's
encoder and by the upstream's accounting of PUBLISH bytes on the wire. (Decoding lives in ``decoder``, the only
place that reads a peer's bytes.)

Seven bits a byte, least significant group first, the high bit set on every byte but the last; at most four
bytes, so 0 .. 268,435,455. A value out of range is our bug: ``LocalProtocolError``."""

from __future__ import annotations

from typing import Final

from edgehub.core.errors import LocalProtocolError

__all__ = ["MAX_VARINT", "encode_varint", "varint_len"]

MAX_VARINT: Final = 268_435_455


def encode_varint(value: int) -> bytes:
    """The variable byte integer for ``value``."""
    if not 0 <= value <= MAX_VARINT:
        raise LocalProtocolError(f"varint out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def varint_len(value: int) -> int:
    """How many bytes ``encode_varint(value)`` takes, without building them."""
    if not 0 <= value <= MAX_VARINT:
        raise LocalProtocolError(f"varint out of range: {value}")
    return 1 if value < 0x80 else 2 if value < 0x4000 else 3 if value < 0x20_0000 else 4
