"""The IoT Hub AMQP conventions as pure functions: addresses, usernames, audiences, the message mapping."""

from __future__ import annotations

import pytest
from proton import Message as AmqpMessage
from proton import symbol

from edgehub.core import Identity, InvalidMessageError, Message, SystemProperty
from protocol_heads.amqp.iothub import (
    AddressKind,
    amqp_from_message,
    identity_of_audience,
    message_from_amqp,
    parse_address,
    parse_plain_username,
)
from protocol_heads.amqp.proton_raw import fields_of

DEV = Identity.parse("dev1")
MOD = Identity.parse("dev1/filter")


def test_addresses_name_their_kind_and_identity() -> None:
    assert parse_address("/devices/dev1/messages/events", outgoing=False) == (
        parse_address("devices/dev1/messages/events", outgoing=False)
    )
    telemetry = parse_address("/devices/dev1/messages/events", outgoing=False)
    assert telemetry is not None
    assert telemetry.kind == AddressKind.TELEMETRY
    assert telemetry.identity == DEV
    inputs = parse_address("/devices/dev1/modules/filter/messages/events", outgoing=True)
    assert inputs is not None
    assert inputs.kind == AddressKind.MODULE_INPUTS
    assert inputs.identity == MOD
    bound = parse_address("/devices/dev1/messages/deviceBound", outgoing=True)
    assert bound is not None
    assert bound.kind == AddressKind.DEVICE_BOUND
    assert parse_address("/devices/dev1/messages/events", outgoing=True) is None
    assert parse_address("/devices/a%2Fb/messages/events", outgoing=False) is None  # not an identity
    assert parse_address("/queues/x", outgoing=False) is None
    assert parse_address("/devices/" + "x" * 5000 + "/messages/events", outgoing=False) is None


def test_plain_usernames_and_audiences_name_identities() -> None:
    assert parse_plain_username("dev1@sas.hub") == DEV
    assert parse_plain_username("dev1/filter@sas.hub") == MOD
    assert parse_plain_username("dev1/modules/filter@sas.hub") == MOD
    assert parse_plain_username("dev1") == DEV
    with pytest.raises(ValueError, match="sas"):
        parse_plain_username("dev1@other")
    assert identity_of_audience("hub.local/devices/dev1/modules/filter") == MOD
    assert identity_of_audience("hub.local%2Fdevices%2Fdev1") == DEV
    with pytest.raises(ValueError, match="audience"):
        identity_of_audience("sb://hub/eventhub")


def test_fields_map_to_the_system_properties_mqtt_uses_as_plain_strings() -> None:
    m = AmqpMessage(body=b"x", id="m1", correlation_id="c1", content_type="application/json")
    m.content_encoding = "utf-8"
    m.user_id = b"me"
    m.group_id = "s1"
    m.expiry_time = 1_700_000_060.0
    m.annotations = {symbol("x-opt-partition-key"): "s1", symbol("iothub-outputname"): "out1"}
    m.properties = {"iothub-message-schema": "v1", "k": "v", "n": None, "i": 5}
    got = message_from_amqp(MOD, fields_of(m), auth_method="sas")
    sp = got.system_properties
    assert sp == {
        "messageId": "m1",
        "cid": "c1",
        "contentType": "application/json",
        "contentEncoding": "utf-8",
        "userId": "me",
        "sessionId": "s1",
        "partitionKey": "s1",
        "outputName": "out1",
        "messageSchema": "v1",
        "absolute-expiry-time": "2023-11-14T22:14:20Z",
        "connectionDeviceId": "dev1",
        "connectionModuleId": "filter",
        "connectionAuthMethod": "sas",
    }
    # proton hands symbols (a str subclass) for content-type: the store's encoder takes plain str only.
    assert all(type(v) is str for v in sp.values())
    assert got.properties == {"k": "v", "n": None, "i": "5"}
    assert got.source == "/messages/modules/filter/outputs/out1"


def test_a_client_cannot_claim_another_connection_identity_and_a_device_has_no_output() -> None:
    m = AmqpMessage(body=b"x")
    m.annotations = {symbol("iothub-outputname"): "out1"}
    m.properties = {"iothub-outputname": "out1"}
    got = message_from_amqp(DEV, fields_of(m), auth_method="sas")
    assert SystemProperty.OUTPUT_NAME not in got.system_properties
    assert got.system_properties["connectionDeviceId"] == "dev1"


def test_a_message_without_content_type_has_none() -> None:
    # proton's accessor says symbol("None") for a null content-type: the mapping must not take it for one.
    decoded = AmqpMessage()
    decoded.decode(AmqpMessage(body=b"x").encode())
    got = message_from_amqp(DEV, fields_of(decoded), auth_method="sas")
    assert SystemProperty.CONTENT_TYPE not in got.system_properties
    assert SystemProperty.CONTENT_ENCODING not in got.system_properties


def test_user_id_that_is_not_utf8_is_refused() -> None:
    m = AmqpMessage(body=b"x")
    m.user_id = b"\xff\xfe"
    with pytest.raises(InvalidMessageError, match="UTF-8"):
        message_from_amqp(DEV, fields_of(m), auth_method="sas")


def test_module_input_carries_input_name_and_sender_as_annotations() -> None:
    msg = Message(b"b", {"k": "v"}, {"messageId": "a", "connectionModuleId": "other", "outputName": "o"})
    out = amqp_from_message(msg, input_name="in1", redelivery=True)
    assert out.annotations == {"x-opt-input-name": "in1", "iothub-connection-module-id": "other"}
    assert out.id == "a"
    assert out.properties == {"k": "v"}
    assert out.delivery_count == 1
    decoded = AmqpMessage()
    decoded.decode(out.encode())
    assert bytes(decoded.body) == b"b"
