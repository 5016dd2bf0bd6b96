"""proton_raw's reader pinned to the general path: for every property, annotation and body type the head accepts
(and the bodies it refuses), ``MessageReader.read`` of the encoded message gives what proton's ``Message`` gives
(``fields_of``), and so the same hub message; one reader, reused, carries nothing from one message to the next."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

import pytest
from proton import Message as AmqpMessage
from proton import MessageException, symbol, ulong

from edgehub.core import Identity, InvalidMessageError, Message
from protocol_heads.amqp.iothub import MessageFields, message_from_amqp
from protocol_heads.amqp.proton_raw import MessageReader, fields_of

DEV = Identity.parse("dev1")
MOD = Identity.parse("dev1/filter")


def _full() -> AmqpMessage:
    m = AmqpMessage(body=b"\x00payload\xff", durable=True)
    m.id = "msg-1"
    m.correlation_id = b"\x01corr"
    m.content_type = "application/json"
    m.content_encoding = "utf-8"
    m.address = "/devices/dev1/messages/events"
    m.user_id = b"dev1"
    m.group_id = "session-7"
    m.expiry_time = 1_700_000_123.5
    m.creation_time = 1_700_000_000.25
    m.properties = {
        "text": "v",
        "number": 42,
        "negative": -3,
        "flag": True,
        "ratio": 0.5,
        "nothing": None,
        "raw": b"\x02bytes",
        "iothub-message-schema": "schema-1",
        "iothub-creation-time-utc": "2024-01-01T00:00:00Z",
        "iothub-operation": "op",
        "iothub-outputname": "out1",
    }
    m.annotations = {
        symbol("x-opt-partition-key"): "pk",
        symbol("iothub-outputname"): "out2",
        symbol("iothub-interface-id"): "urn:x",
        symbol("dt-subject"): "subject",
        symbol("x-opt-other"): 7,
    }
    return m


def _bare(body: object) -> AmqpMessage:
    return AmqpMessage(body=body)


def _with_id(value: object) -> AmqpMessage:
    m = AmqpMessage(body=b"x")
    m.id = value
    m.correlation_id = value
    return m


MESSAGES: dict[str, Callable[[], AmqpMessage]] = {
    "every field": _full,
    "data body only": lambda: _bare(b"telemetry"),
    "empty data body": lambda: _bare(b""),
    "string body": lambda: _bare("text body"),
    "no body": lambda: _bare(None),
    "ulong ids": lambda: _with_id(ulong(12345)),
    "uuid ids": lambda: _with_id(UUID("12345678-1234-5678-1234-567812345678")),
    "binary ids": lambda: _with_id(b"\x00\xffid"),
    "map body": lambda: _bare({"k": "v"}),
    "list body": lambda: _bare([1, 2, 3]),
    "int body": lambda: _bare(7),
}


def _general(encoded: bytes) -> MessageFields:
    decoded = AmqpMessage()
    decoded.decode(encoded)
    return fields_of(decoded)


def _hub(identity: Identity, fields: MessageFields) -> Message | str:
    try:
        return message_from_amqp(identity, fields, auth_method="sas")
    except InvalidMessageError as exc:
        return f"refused: {exc}"


@pytest.mark.parametrize("name", list(MESSAGES))
def test_the_reader_gives_what_protons_message_gives(name: str) -> None:
    encoded = MESSAGES[name]().encode()
    read = MessageReader().read(encoded)
    assert read == _general(encoded)
    for identity in (DEV, MOD):
        assert _hub(identity, read) == _hub(identity, _general(encoded))


def test_a_reused_reader_carries_nothing_over() -> None:
    reader = MessageReader()
    order = ["every field", "no body", "binary ids", "data body only", "map body", "every field", "string body"]
    kept = []
    for name in order:
        encoded = MESSAGES[name]().encode()
        fields = reader.read(encoded)
        assert fields == _general(encoded), name
        kept.append((fields, encoded))
    # What a read gave stays as it was after later reads (nothing is a view into the reused message).
    for fields, encoded in kept:
        assert fields == _general(encoded)
        assert isinstance(fields.body, bytes | str | type(None) | dict | list)


def test_a_binary_id_and_body_are_owned_bytes() -> None:
    reader = MessageReader()
    first = reader.read(MESSAGES["binary ids"]().encode())
    reader.read(_full().encode())
    assert (type(first.id), first.id) == (bytes, b"\x00\xffid")
    assert (type(first.correlation_id), first.correlation_id) == (bytes, b"\x00\xffid")
    assert (type(first.body), first.body) == (bytes, b"x")


def test_a_binary_property_is_owned_bytes_on_both_paths() -> None:
    reader = MessageReader()
    encoded = _full().encode()
    first, general = reader.read(encoded), _general(encoded)  # _general's proton message is gone on return
    reader.read(MESSAGES["binary ids"]().encode())
    for fields in (first, general):
        assert fields.properties is not None
        assert (type(fields.properties["raw"]), fields.properties["raw"]) == (bytes, b"\x02bytes")


@pytest.mark.parametrize("junk", [b"", b"\x00", b"not a message at all", b"\x00Sp\xd0\x00\x00\x00\xff"])
def test_bytes_that_are_no_message_are_refused_as_proton_refuses_them(junk: bytes) -> None:
    general_refuses = False
    try:
        _general(junk)
    except MessageException:
        general_refuses = True
    if general_refuses:
        with pytest.raises(MessageException):
            MessageReader().read(junk)
    else:
        assert MessageReader().read(junk) == _general(junk)
