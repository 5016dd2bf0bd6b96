"""The SASL layer of an AMQP 1.0 connection, server side, sans-IO: bytes in, the client's ``sasl-init`` out; our
header, ``sasl-mechanisms`` and ``sasl-outcome`` as bytes to send. Or no SASL layer at all: a client that opens
with the plain AMQP header (protocol id 0), as the official Azure IoT SDKs do, skips it and logs in with a CBS
``put-token``, as after ANONYMOUS; the header is taken only where ANONYMOUS is offered (``skipped``).

Why our own and not proton's: proton built without Cyrus SASL (no ``libsasl2-dev``, as on a fresh Pi) cannot
check a PLAIN password at all, and with Cyrus it checks passwords against Cyrus's own database: neither can check
a SAS token against the hub's identities. The exchange is three small frames, so the head speaks it itself and
hands proton's transport only the AMQP layer that follows (``AMQP 0 1 0 0`` onwards).

Invariants:
* Input is bounded: the header is 8 bytes, a SASL frame at most ``MAX_SASL_FRAME`` bytes (a SAS token is at most
  4 KiB), and what the client pipelines after ``sasl-init`` while the hub decides at most ``max_pipelined``
  bytes; anything over, or not SASL, raises ``SaslError`` (the caller closes the connection).
* ``outcome`` is given once; only after an ``ok`` outcome does ``rest`` hold the AMQP bytes to hand on. When the
  client skipped SASL (``skipped``), the exchange is ``done`` at once and ``rest`` holds everything it sent, the
  AMQP header included.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NoReturn

from proton import Data, Described, symbol

__all__ = ["AMQP_HEADER", "MAX_SASL_FRAME", "SASL_HEADER", "SaslCode", "SaslError", "SaslInit", "SaslServer"]

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
MAX_SASL_FRAME = 8 * 1024
_FRAME_HEADER = struct.Struct(">IBBH")
_SASL_FRAME_TYPE = 1
_MECHANISMS = 0x40
_INIT = 0x41
_OUTCOME = 0x44


class SaslCode(IntEnum):
    """``sasl-code`` of the outcome (AMQP 1.0, 5.3.3.6)."""

    OK = 0
    AUTH = 1  # authentication failed: bad credentials
    SYS = 2  # a system error, possibly lasting
    SYS_PERM = 3
    SYS_TEMP = 4  # a system error, try later (a throttled login)


class SaslError(Exception):
    """The client broke the SASL exchange (a wrong header, a malformed or oversized frame)."""


@dataclass(frozen=True, slots=True)
class SaslInit:
    """The client chose ``mechanism`` and sent ``response`` (PLAIN: ``authzid NUL authcid NUL password``)."""

    mechanism: str
    response: bytes
    hostname: str | None = None


def _frame(descriptor: int, fill: Sequence[object]) -> bytes:
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(descriptor)
    data.put_list()
    data.enter()
    for value in fill:
        if isinstance(value, list):
            data.put_array(False, Data.SYMBOL)
            data.enter()
            for item in value:
                data.put_symbol(symbol(item))
            data.exit()
        elif isinstance(value, int):
            data.put_ubyte(value)
        else:
            raise TypeError(f"cannot encode {value!r}")
    data.exit()
    data.exit()
    body: bytes = data.encode()
    return _FRAME_HEADER.pack(8 + len(body), 2, _SASL_FRAME_TYPE, 0) + body


def _decode_init(body: bytes) -> SaslInit:
    data = Data()
    try:
        data.decode(body)
        data.rewind()
        if data.next() is None:
            raise SaslError("empty SASL frame")
        value = data.get_object()
    except SaslError:
        raise
    except Exception as exc:  # proton's DataException and friends: the bytes are not AMQP
        raise SaslError(f"malformed SASL frame: {exc}") from exc
    if not isinstance(value, Described) or value.descriptor not in (_INIT, "amqp:sasl-init:list"):
        raise SaslError("expected sasl-init")
    fields = value.value
    if not isinstance(fields, list) or not fields or not isinstance(fields[0], str):
        raise SaslError("sasl-init without a mechanism")
    response = fields[1] if len(fields) > 1 else None
    if response is None:
        response = b""
    elif isinstance(response, memoryview | bytes):
        response = bytes(response)
    else:
        raise SaslError("sasl-init response is not binary")
    hostname = fields[2] if len(fields) > 2 and isinstance(fields[2], str) else None
    return SaslInit(str(fields[0]), response, hostname)


class SaslServer:
    """One connection's SASL exchange (module docstring). ``receive_data`` returns the ``SaslInit`` once it has
    arrived (None until then); ``outcome`` answers it."""

    def __init__(self, mechanisms: Sequence[str], *, max_pipelined: int = 64 * 1024) -> None:
        if not mechanisms:
            raise ValueError("offer at least one SASL mechanism")
        self.mechanisms = tuple(mechanisms)
        self.max_pipelined = max_pipelined
        self._buffer = bytearray()
        self._out = bytearray()
        self._state = "header"  # header → init → deciding → done | failed
        self.init: SaslInit | None = None
        self.rest = b""  # AMQP bytes after an ok outcome
        self.skipped = False  # the client sent the plain AMQP header: no SASL layer, a CBS token to come

    @property
    def done(self) -> bool:
        return self._state == "done"

    def receive_data(self, data: bytes) -> SaslInit | None:
        if self._state in ("done", "failed"):
            raise SaslError("SASL exchange is over")
        self._buffer += data
        if self._state == "header":
            start = bytes(self._buffer[:8])
            if len(start) < 8:
                if not (SASL_HEADER.startswith(start) or (self._plain_allowed and AMQP_HEADER.startswith(start))):
                    self._bad_header()
                return None
            if start == AMQP_HEADER and self._plain_allowed:
                self._state = "done"
                self.skipped = True
                self.rest = bytes(self._buffer)  # the header too: proton's transport reads it
                self._buffer.clear()
                return None
            if start != SASL_HEADER:
                self._bad_header()
            del self._buffer[:8]
            self._out += SASL_HEADER + _frame(_MECHANISMS, [list(self.mechanisms)])
            self._state = "init"
        if self._state == "init":
            if len(self._buffer) < 8:
                return None
            size, doff, frame_type, _channel = _FRAME_HEADER.unpack_from(self._buffer)
            if size > MAX_SASL_FRAME or size < 8 or doff < 2 or doff * 4 > size or frame_type != _SASL_FRAME_TYPE:
                self._state = "failed"
                raise SaslError(f"bad SASL frame header (size {size}, doff {doff}, type {frame_type})")
            if len(self._buffer) < size:
                return None
            body = bytes(self._buffer[doff * 4 : size])
            del self._buffer[:size]
            try:
                init = _decode_init(body)
            except SaslError:
                self._state = "failed"
                raise
            if init.mechanism not in self.mechanisms:
                self._state = "failed"
                self._out += _frame(_OUTCOME, [int(SaslCode.AUTH)])
                raise SaslError(f"mechanism {init.mechanism[:32]!r} is not offered")
            self._state = "deciding"
            self.init = init
            return init
        if len(self._buffer) > self.max_pipelined:  # deciding: the client pipelines while the hub checks
            self._state = "failed"
            raise SaslError(f"over {self.max_pipelined} bytes sent before the SASL outcome")
        return None

    @property
    def _plain_allowed(self) -> bool:
        """No SASL layer is ANONYMOUS in all but name (the identity comes with a ``$cbs`` token): taken where it is."""
        return "ANONYMOUS" in self.mechanisms

    def _bad_header(self) -> NoReturn:
        # Say which protocol is spoken here (AMQP 1.0, 2.2: answer a header we do not take with ours), then end.
        self._state = "failed"
        self._out += SASL_HEADER
        raise SaslError("not an AMQP header (SASL, or plain AMQP where ANONYMOUS is offered)")

    def outcome(self, code: SaslCode) -> None:
        if self._state != "deciding":
            raise RuntimeError("outcome before sasl-init, or twice")
        self._out += _frame(_OUTCOME, [int(code)])
        if code == SaslCode.OK:
            self._state = "done"
            self.rest = bytes(self._buffer)
        else:
            self._state = "failed"
        self._buffer.clear()

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out
