"""Performatives written out in full: every field of ``open``, ``begin``, ``attach``, ``flow``, ``transfer``,
``disposition``, ``detach``, ``end`` and ``close``, trailing nulls included (a transfer's payload after them).

Why: AMQP 1.0 lets a list end early when its last fields are null (proton does so), but Azure's pure-Python AMQP
stack (``azure-eventhub``/``azure-servicebus``'s ``_pyamqp``) reads performatives' fields by position and fails
on a short list, since the Azure services always write them in full. Padding them here, on the way out, costs a
walk over the frame headers of a write and a few bytes per frame.

Invariants: ``pad`` returns the same frames in the same order, each with the same channel, descriptor and fields
(nulls appended) and the same payload; anything it does not recognise (an empty frame, a descriptor it does not
know, a frame cut off at the end of the write) is passed on unchanged.
"""

from __future__ import annotations

import struct

__all__ = ["FIELDS", "pad"]

# descriptor code → how many fields the performative has (AMQP 1.0, 2.7).
FIELDS: dict[int, int] = {0x10: 10, 0x11: 8, 0x12: 14, 0x13: 11, 0x14: 11, 0x15: 6, 0x16: 3, 0x17: 1, 0x18: 1}
_SIZE = struct.Struct(">I")
_NULL = 0x40


def pad(data: bytes) -> bytes:
    """``data`` (whole AMQP frames, as proton writes them) with short performatives padded (module docstring)."""
    out: bytearray | None = None
    at = 0
    n = len(data)
    while at + 8 <= n:
        if data[at : at + 4] == b"AMQP":  # the protocol header that starts the stream
            if out is not None:
                out += data[at : at + 8]
            at += 8
            continue
        size = _SIZE.unpack_from(data, at)[0]
        if size < 8 or at + size > n:
            break  # not a frame we can read whole: leave the rest as it is
        doff = data[at + 4] * 4
        body = at + doff
        end = at + size
        code = data[body + 2] if body + 3 < end and data[body] == 0x00 and data[body + 1] == 0x53 else -1
        want = FIELDS.get(code)
        if want is not None:
            padded = _padded(data, body + 3, end, want)
            if padded is not None:
                if out is None:
                    out = bytearray(data[:at])
                header = bytearray(data[at : body + 3])
                _SIZE.pack_into(header, 0, len(header) + len(padded))
                out += header
                out += padded
                at = end
                continue
        if out is not None:
            out += data[at:end]
        at = end
    if out is None:
        return data
    out += data[at:]
    return bytes(out)


def _padded(data: bytes, start: int, end: int, want: int) -> bytes | None:
    """The list at ``data[start:]`` with nulls up to ``want`` fields, and what follows it up to ``end`` (a
    transfer's payload); None if it is full or not a list."""
    constructor = data[start]
    if constructor == 0x45:  # list0
        count, items, rest = 0, b"", data[start + 1 : end]
    elif constructor == 0xC0 and start + 3 <= end:
        stop = start + 2 + data[start + 1]
        count, items, rest = data[start + 2], data[start + 3 : stop], data[stop:end]
    elif constructor == 0xD0 and start + 9 <= end:
        stop = start + 5 + _SIZE.unpack_from(data, start + 1)[0]
        count, items, rest = _SIZE.unpack_from(data, start + 5)[0], data[start + 9 : stop], data[stop:end]
    else:
        return None
    missing = want - count
    if missing <= 0:
        return None
    items = bytes(items) + bytes([_NULL]) * missing
    if len(items) + 1 <= 255:
        return bytes([0xC0, len(items) + 1, want]) + items + rest
    return b"\xd0" + _SIZE.pack(len(items) + 4) + _SIZE.pack(want) + items + rest
