"""proton's C engine below its Python wrappers, for the AMQP head's per-transfer work; the one module that reads
proton's internals (``cproton``, its cffi binding, and the wrappers' ``_impl``/``_msg`` handles).

Why: proton's Python layer builds a wrapper object per event and per engine object it touches (``Event.wrap``
wraps the event's delivery, link, session, connection and transport, each with a record lookup and a reference),
and its ``Message`` turns every section into Python objects. Per transfer that was most of the head's CPU, so the
transfer path (a ``PN_DELIVERY`` on an incoming link, its settlement, the message's decode) goes through the C
calls here; the rare events (open, attach, close, outcomes of what the hub sent) keep proton's wrappers.

Invariants:
* A ``RawDelivery`` holds a reference on its ``pn_delivery_t`` for as long as it lives, as proton's ``Delivery``
  wrapper does (``pn_incref``/``pn_decref``), so a settlement after the link or connection went touches live memory.
* ``MessageReader.read`` gives the same ``MessageFields`` as ``fields_of`` (proton's ``Message``, the general
  path) for every message the head accepts: sections it does not read cheaply (a non-empty map, a body that is not
  ``data``) go through proton's own ``Data.get_object``. ``tests/protocol_heads/amqp/test_proton_raw.py`` pins it.
"""

from __future__ import annotations

from typing import Any

from cproton import (
    PN_ACCEPTED,
    PN_BINARY,
    PN_DELIVERY,
    PN_NULL,
    bytes2pybytes,
    isnull,
    msgid2py,
    pn_collector_peek,
    pn_collector_pop,
    pn_data_next,
    pn_data_rewind,
    pn_data_type,
    pn_decref,
    pn_delivery_aborted,
    pn_delivery_link,
    pn_delivery_partial,
    pn_delivery_pending,
    pn_delivery_readable,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_delivery_update,
    pn_event_delivery,
    pn_event_type,
    pn_incref,
    pn_link_advance,
    pn_link_is_receiver,
    pn_message_get_content_encoding,
    pn_message_get_content_type,
)
from cproton import ffi as _ffi
from cproton import lib as _lib
from proton import Data, MessageException
from proton import Message as AmqpMessage

from protocol_heads.amqp.iothub import MessageFields

__all__ = [
    "PN_DELIVERY",
    "MessageReader",
    "RawDelivery",
    "accept_and_settle",
    "delivery_link",
    "delivery_settled",
    "event_delivery",
    "event_type",
    "fields_of",
    "handle",
    "link_is_receiver",
    "next_event",
    "pop_event",
    "receive_whole",
]

# Aliases under the names the connection reads them by: the collector walk and the transfer's facts.
event_type = pn_event_type
event_delivery = pn_event_delivery
pop_event = pn_collector_pop
delivery_link = pn_delivery_link
link_is_receiver = pn_link_is_receiver
delivery_settled = pn_delivery_settled


def handle(wrapper: Any) -> Any:
    """The C object under one of proton's wrappers (a ``Collector``, ``Link``...)."""
    return wrapper._impl  # proton's handle on its C object: this module's job (module docstring)


def next_event(collector_impl: Any) -> Any:
    """The collector's next raw event, or None."""
    raw = pn_collector_peek(collector_impl)
    return None if isnull(raw) else raw


class RawDelivery:
    """A received transfer's ``pn_delivery_t``, kept alive (module docstring) until settled and let go."""

    __slots__ = ("impl",)

    def __init__(self, impl: Any) -> None:
        pn_incref(impl)
        self.impl = impl

    def __del__(self) -> None:
        pn_decref(self.impl)


def receive_whole(delivery: Any, link: Any, max_size: int) -> bytes | None:
    """The transfer's bytes when it is whole, readable, not aborted and at most ``max_size`` (the link moves on
    to the next transfer); None for every other case, which the caller handles with proton's wrappers."""
    if pn_delivery_partial(delivery) or not pn_delivery_readable(delivery) or pn_delivery_aborted(delivery):
        return None
    size = pn_delivery_pending(delivery)
    if size > max_size:
        return None
    buffer = bytearray(size)
    # cproton's pn_link_recv copies into a fresh bytearray and slices it; this reads into ours once.
    got = _lib.pn_link_recv(link, _ffi.from_buffer(buffer), size)
    pn_link_advance(link)
    return bytes(buffer) if got == size else bytes(buffer[: max(got, 0)])


_SCRATCH = bytearray(1 << 16)  # what drop_read reads dropped bytes into (one thread: the event loop's)


def drop_read(delivery: Any, link: Any) -> tuple[int, bool]:
    """Drop, unread, what proton holds of ``delivery`` (the current transfer on incoming ``link``): how many bytes,
    and whether the transfer has ended (its last frame came, or the client aborted it; the link then moved on)."""
    scratch = _ffi.from_buffer(_SCRATCH)
    dropped = 0
    while pn_delivery_pending(delivery) > 0:
        got = _lib.pn_link_recv(link, scratch, len(_SCRATCH))
        if got <= 0:
            break
        dropped += got
    if pn_delivery_partial(delivery) and not pn_delivery_aborted(delivery):
        return dropped, False
    pn_link_advance(link)
    return dropped, True


def accept_and_settle(delivery: RawDelivery) -> None:
    pn_delivery_update(delivery.impl, PN_ACCEPTED)
    pn_delivery_settle(delivery.impl)


class MessageReader:
    """Decodes encoded messages into one reused ``pn_message_t`` and reads the fields the
    IoT Hub mapping needs. Not thread-safe; one per connection."""

    def __init__(self) -> None:
        self._owner = AmqpMessage()  # owns the pn_message_t (frees it when collected)
        self._msg = self._owner._msg  # proton's pn_message_t handle: this module's job (module docstring)

    def read(self, encoded: bytes) -> MessageFields:
        """Raises proton's ``MessageException`` for bytes that are not a message."""
        msg = self._msg
        # pn_message_decode leaves a section the new message lacks as the last message had it (proton's Message
        # only missed that because it never rewinds): cleared first, a message without properties has none.
        _lib.pn_message_clear(msg)
        err = _lib.pn_message_decode(msg, _ffi.from_buffer(encoded), len(encoded))
        if err < 0:
            raise MessageException(f"[{err}]: not an AMQP message")
        # cproton's getters, less their Python layer: most fields are null in most messages.
        user_id = _lib.pn_message_get_user_id(msg)
        return MessageFields(
            body=_body(_lib.pn_message_body(msg)),
            properties=_map(_lib.pn_message_properties(msg)),
            annotations=_map(_lib.pn_message_annotations(msg)),
            id=_id(_lib.pn_message_get_id(msg)),
            correlation_id=_id(_lib.pn_message_get_correlation_id(msg)),
            content_type=_str(_lib.pn_message_get_content_type(msg)),
            content_encoding=_str(_lib.pn_message_get_content_encoding(msg)),
            address=_str(_lib.pn_message_get_address(msg)),
            user_id=_unpack(user_id.start, user_id.size) if user_id.size else b"",
            group_id=_str(_lib.pn_message_get_group_id(msg)),
            expiry_time=_lib.pn_message_get_expiry_time(msg) / 1000.0,
            creation_time=_lib.pn_message_get_creation_time(msg) / 1000.0,
        )


_NULL = _ffi.NULL
_unpack = _ffi.unpack


def _str(chars: Any) -> str | None:
    decoded: str | None = None if chars == _NULL else _ffi.string(chars).decode("utf8")  # as cproton's utf82string
    return decoded


def _id(atom: Any) -> Any:
    return None if atom.type == PN_NULL else _owned(msgid2py(atom))


def fields_of(message: AmqpMessage) -> MessageFields:
    """The general path: proton's ``Message`` (decoded) read through its wrappers. Binary values as bytes of their
    own (proton's are views into the message, gone with it). Content type and encoding are read from its
    pn_message_t handle (``_msg``) with the C calls ``MessageReader`` makes: proton's internals, this module's job."""
    return MessageFields(
        body=_owned(message.body),
        properties=_owned(message.properties),
        annotations=_owned(message.annotations),
        id=_owned(message.id),
        correlation_id=_owned(message.correlation_id),
        content_type=pn_message_get_content_type(message._msg),
        content_encoding=pn_message_get_content_encoding(message._msg),
        address=message.address,
        user_id=message.user_id,
        group_id=message.group_id,
        expiry_time=message.expiry_time,
        creation_time=message.creation_time,
    )


def _owned(value: Any) -> Any:
    # A binary value (an id, a property, in a map or list body) is a view into the pn_message_t, which the next
    # decode overwrites or its free releases: a copy of our own, through maps and lists.
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return type(value)({k: _owned(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_owned(v) for v in value]
    return value


def _body(data: Any) -> Any:
    pn_data_rewind(data)
    if not pn_data_next(data):
        return None
    if pn_data_type(data) == PN_BINARY:  # a data section, the common case: bytes of our own, not cproton's view
        return bytes2pybytes(_lib.pn_data_get_binary(data))
    return _owned(_general(data))


def _map(data: Any) -> Any:
    pn_data_rewind(data)
    if not pn_data_next(data):
        return None
    return _owned(_general(data))


def _general(data: Any) -> Any:
    # proton's own conversion, positioned on the node (as Message._post_decode reads it).
    wrapped = Data(data)
    return wrapped.get_object()
