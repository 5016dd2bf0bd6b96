"""The transfer decoder pinned to decoding in full: whatever order messages come in (the same sections again with a
new body, other sections, other identities, refused ones), one ``TransferDecoder`` gives each the hub message (or
the refusal) that ``message_from_amqp`` of proton_raw's full read gives; and ``data_body`` finds the body only where
the message ends with its one data section."""

from __future__ import annotations

import pytest
from proton import Message as AmqpMessage
from proton import symbol

from edgehub.core import Identity, InvalidMessageError, Message
from protocol_heads.amqp.iothub import message_from_amqp
from protocol_heads.amqp.proton_raw import MessageReader
from protocol_heads.amqp.transfers import MAX_KEPT_PREFIX, TransferDecoder, data_body

DEV = Identity.parse("dev1")
MOD = Identity.parse("dev1/filter")
FOOTER = b"\x00\x53\x78\xc1\x01\x00"  # an empty footer map after the body


def _message(body: object, *, inferred: bool = True, **fields: object) -> bytes:
    # inferred: a bytes body goes in a data section (as Azure's SDKs send it); else in an amqp-value (proton's).
    m = AmqpMessage(body=body, durable=True, inferred=inferred if isinstance(body, bytes) else False)
    for name, value in fields.items():
        setattr(m, name, value)
    return bytes(m.encode())


def _full(identity: Identity, encoded: bytes, auth: str = "sas") -> Message | str:
    try:
        return message_from_amqp(identity, MessageReader().read(encoded), auth_method=auth)
    except InvalidMessageError as exc:
        return f"refused: {exc}"


def _decoded(decoder: TransferDecoder, identity: Identity, encoded: bytes, auth: str = "sas") -> Message | str:
    try:
        return decoder.message(identity, encoded, auth_method=auth)
    except InvalidMessageError as exc:
        return f"refused: {exc}"


PROPS = {"a": "1", "iothub-message-schema": "s", "iothub-outputname": "o"}
ANNOTATIONS = {symbol("x-opt-partition-key"): "pk", symbol("iothub-interface-id"): "urn:i"}
STREAM: list[tuple[Identity, bytes, str]] = [
    (DEV, _message(b"one"), "sas"),
    (DEV, _message(b"two"), "sas"),  # the same sections, a new body
    (DEV, _message(b"value", inferred=False), "sas"),  # the same, the body an amqp-value
    (DEV, _message(b"value 2", inferred=False), "sas"),
    (DEV, _message(b"x" * 300), "sas"),  # a body over 255 bytes (vbin32)
    (MOD, _message(b"three"), "sas"),  # another identity with the same sections
    (MOD, _message(b"three"), "x509"),  # another auth method
    (DEV, _message(b"p1", properties=PROPS, annotations=ANNOTATIONS, content_type="application/json"), "sas"),
    (DEV, _message(b"p2", properties=PROPS, annotations=ANNOTATIONS, content_type="application/json"), "sas"),
    (MOD, _message(b"p3", properties=PROPS, annotations=ANNOTATIONS, content_type="application/json"), "sas"),
    (DEV, _message(b"id", id="m-1", user_id=b"dev1"), "sas"),
    (DEV, _message(b"id", id="m-2", user_id=b"dev1"), "sas"),  # another id: other sections
    (DEV, _message(b"bad", user_id=b"\xff\xfe"), "sas"),  # refused: user-id is not UTF-8
    (DEV, _message(b"bad again", user_id=b"\xff\xfe"), "sas"),  # refused again, not taken from a kept one
    (DEV, _message("a string body"), "sas"),  # a value body: decoded in full
    (DEV, _message(b"after"), "sas"),
    (DEV, _message(b"footer") + FOOTER, "sas"),  # a footer after the body: decoded in full
    (DEV, _message(b"after"), "sas"),
    (DEV, _message(b"big", properties={"k": "v" * (MAX_KEPT_PREFIX + 10)}), "sas"),  # sections too long to keep
    (DEV, _message(b"big 2", properties={"k": "v" * (MAX_KEPT_PREFIX + 10)}), "sas"),
    (DEV, _message({"k": 1}), "sas"),  # refused: a map body
]


def test_a_stream_of_transfers_maps_as_decoding_each_in_full() -> None:
    decoder = TransferDecoder()
    for n, (identity, encoded, auth) in enumerate(STREAM):
        assert _decoded(decoder, identity, encoded, auth) == _full(identity, encoded, auth), n


def test_the_same_sections_again_take_the_kept_properties() -> None:
    # The kept path is the one under test above: a message with the same sections shares the last one's maps.
    decoder = TransferDecoder()
    first = decoder.message(DEV, _message(b"a", properties=PROPS), auth_method="sas")
    second = decoder.message(DEV, _message(b"b", properties=PROPS), auth_method="sas")
    assert second.body == b"b"
    assert second.properties is first.properties
    assert second.system_properties is first.system_properties
    other = decoder.message(MOD, _message(b"c", properties=PROPS), auth_method="sas")
    assert other.system_properties is not first.system_properties
    # Sections over MAX_KEPT_PREFIX are not kept (a connection keeps a bounded amount).
    big = {"k": "v" * (MAX_KEPT_PREFIX + 10)}
    one = decoder.message(DEV, _message(b"d", properties=big), auth_method="sas")
    two = decoder.message(DEV, _message(b"e", properties=big), auth_method="sas")
    assert two.properties == one.properties
    assert two.properties is not one.properties


@pytest.mark.parametrize(
    ("encoded", "expect_body"),
    [
        (_message(b"telemetry"), b"telemetry"),
        (_message(b""), b""),
        (_message(b"value", inferred=False), b"value"),
        (_message(b"y" * 70000), b"y" * 70000),
        (_message(b"p", properties=PROPS, annotations=ANNOTATIONS, id="i", group_id="g"), b"p"),
        (_message("text"), None),
        (_message(None), None),
        (_message([1, 2]), None),
        (_message(b"footer") + FOOTER, None),
        (_message(b"two") + b"\x00\x53\x75\xa0\x01z", None),  # a second data section
        (_message(b"cut")[:-1], None),
        (b"", None),
        (b"\x00\x53\x75", None),
        (b"\x00\x53\x75\xa0\x05ab", None),
        (b"\x00\xa3\x10amqp:data:binary\xa0\x01z", None),  # a descriptor by name
        (b"\x00\x53\x70\xc0\xff\x00\x00\x53\x75\xa0\x01z", None),  # a header whose size runs past the end
        (b"junk", None),
    ],
)
def test_data_body_finds_the_body_of_a_message_ending_with_its_data_section(
    encoded: bytes, expect_body: bytes | None
) -> None:
    split = data_body(encoded)
    if expect_body is None:
        assert split is None
    else:
        assert split is not None
        at, body = split
        assert body == expect_body
        assert encoded[at : at + 3] in (b"\x00\x53\x75", b"\x00\x53\x77")
