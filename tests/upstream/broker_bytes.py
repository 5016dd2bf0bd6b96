"""Small builders for MQTT bytes written by hand in the upstream client's tests (the broker's side of the wire)."""

from __future__ import annotations

import struct


def text(s: str) -> bytes:
    """A UTF-8 string field: two length bytes, then the text."""
    raw = s.encode()
    return struct.pack("!H", len(raw)) + raw


def with_header(first: int, body: bytes) -> bytes:
    """A short packet: its first byte, a one-byte remaining length, its body."""
    assert len(body) < 128
    return bytes((first, len(body))) + body
