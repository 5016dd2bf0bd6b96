"""IoT Hub MQTT conventions: identities, topics, the property bag, ACLs and the Message mapping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgehub.core import Identity, InvalidMessageError, Message, SystemProperty
from protocol_heads.mqtt.iothub import (
    PLAIN_TOPIC_PROPERTY,
    Acl,
    PlainTopic,
    TelemetryTopic,
    TopicError,
    TwinRequest,
    decode_property_bag,
    delivery_user_properties,
    device_bound_topic,
    encode_property_bag,
    is_method_response,
    message_from_publish,
    module_input_topic,
    parse_client_id,
    parse_publish_topic,
    parse_username,
    telemetry_topic,
    topic_matches,
    twin_response_topic,
    username_identity,
)

DEV = Identity.parse("dev1")
MOD = Identity.parse("dev1/filter")


def test_client_ids_are_devices_or_modules() -> None:
    assert parse_client_id("dev1") == DEV
    assert parse_client_id("dev1/filter") == MOD
    with pytest.raises(ValueError, match="client id"):
        parse_client_id("a/b/c")


def test_username_carries_host_identity_and_api_version() -> None:
    info = parse_username("gw.local/dev1/filter/?api-version=2021-04-12&DeviceClientType=py")
    assert info.host == "gw.local"
    assert info.identity == MOD
    assert info.api_version == "2021-04-12"
    assert info.params["DeviceClientType"] == "py"
    assert parse_username("h/dev1/?api-version=2018-06-30").identity == DEV
    with pytest.raises(ValueError, match="username"):
        parse_username("just-a-name")


def test_property_bag_decodes_system_and_url_encoded_application_properties() -> None:
    system, app = decode_property_bag("$.mid=m%201&$.ct=application%2Fjson&$.ce=utf-8&temp%20alert=a%26b%3Dc&flag")
    assert system == {"messageId": "m 1", "contentType": "application/json", "contentEncoding": "utf-8"}
    assert app == {"temp alert": "a&b=c", "flag": None}


def test_interface_id_and_component_name_of_the_azure_sdks_are_system_properties() -> None:
    # What the Python SDK sends for a security message, and the Plug and Play component of the C# SDK.
    system, app = decode_property_bag("$.ifid=urn%3Aazureiot%3ASecurity%3ASecurityAgent%3A1&$.sub=thermostat1")
    assert system == {"iothub-interface-id": "urn:azureiot:Security:SecurityAgent:1", "dt-subject": "thermostat1"}
    assert app == {}
    assert encode_property_bag(system, {}) == "$.ifid=urn%3Aazureiot%3ASecurity%3ASecurityAgent%3A1&$.sub=thermostat1"


@given(
    st.dictionaries(st.sampled_from(["messageId", "cid", "contentType", "to", "userId", "creationTime"]), st.text()),
    st.dictionaries(st.text(min_size=1).filter(lambda k: not k.startswith("$.")), st.none() | st.text()),
)
def test_property_bag_round_trips_any_text(system: dict[str, str], app: dict[str, str | None]) -> None:
    assert decode_property_bag(encode_property_bag(system, app)) == (system, app)


def test_publish_topics_are_classified() -> None:
    assert parse_publish_topic("devices/dev1/messages/events/$.mid=1") == TelemetryTopic(DEV, "$.mid=1")
    assert parse_publish_topic("devices/dev1/messages/events/") == TelemetryTopic(DEV, "")
    assert parse_publish_topic("devices/dev1/messages/events") == TelemetryTopic(DEV, "")
    assert parse_publish_topic("devices/dev1/modules/filter/messages/events/a=b") == TelemetryTopic(MOD, "a=b")
    twin = parse_publish_topic("$iothub/twin/PATCH/properties/reported/?$rid=7")
    assert twin == TwinRequest("PATCH_REPORTED", "7", {"$rid": "7"})
    assert parse_publish_topic("$iothub/twin/GET/?$rid=1") == TwinRequest("GET", "1", {"$rid": "1"})
    assert parse_publish_topic("factory/line1/temp") == PlainTopic("factory/line1/temp")


def test_telemetry_from_a_device_becomes_a_message_with_connection_properties() -> None:
    msg = message_from_publish(
        DEV,
        "devices/dev1/messages/events/$.mid=42&$.cid=c7&$.ct=application%2Fjson&$.cdid=spoof&level=high",
        b"{}",
        auth_method="sas",
        now_s=0,
    )
    assert msg.system_properties == {
        "messageId": "42",
        "cid": "c7",
        "contentType": "application/json",
        "connectionDeviceId": "dev1",
        "connectionAuthMethod": "sas",
    }
    assert msg.properties == {"level": "high"}
    assert msg.source == "/messages"


def test_module_output_name_sets_the_route_source() -> None:
    msg = message_from_publish(
        MOD, "devices/dev1/modules/filter/messages/events/$.on=alerts", b"x", auth_method="sas", now_s=0
    )
    assert msg.source == "/messages/modules/filter/outputs/alerts"


def test_a_device_cannot_claim_an_output_name() -> None:
    msg = message_from_publish(DEV, "devices/dev1/messages/events/$.on=o", b"", auth_method="sas", now_s=0)
    assert SystemProperty.OUTPUT_NAME not in msg.system_properties


def test_mqtt5_properties_map_onto_the_same_message_properties() -> None:
    msg = message_from_publish(
        MOD,
        "devices/dev1/modules/filter/messages/events/",
        b"x",
        auth_method="sas",
        now_s=1_700_000_000,
        content_type="text/plain",
        correlation_data=b"corr-1",
        message_expiry_s=60,
        user_properties=[("$.mid", "m9"), ("$.on", "out"), ("colour", "red")],
    )
    assert msg.system_properties["contentType"] == "text/plain"
    assert msg.system_properties["cid"] == "corr-1"
    assert msg.system_properties["messageId"] == "m9"
    assert msg.system_properties["absolute-expiry-time"] == "2023-11-14T22:14:20Z"
    assert msg.properties == {"colour": "red"}
    assert msg.source == "/messages/modules/filter/outputs/out"


def test_binary_correlation_data_is_invalid() -> None:
    with pytest.raises(InvalidMessageError):
        message_from_publish(
            DEV, "devices/dev1/messages/events/", b"", auth_method="sas", now_s=0, correlation_data=b"\xff"
        )


def test_plain_topic_is_kept_as_an_application_property() -> None:
    msg = message_from_publish(DEV, "factory/line1/temp", b"21.5", auth_method="password", now_s=0)
    assert msg.properties == {PLAIN_TOPIC_PROPERTY: "factory/line1/temp"}
    assert msg.system_properties["connectionDeviceId"] == "dev1"


def test_telemetry_as_another_identity_is_a_topic_error() -> None:
    with pytest.raises(TopicError):
        message_from_publish(DEV, "devices/dev2/messages/events/", b"", auth_method="sas", now_s=0)
    with pytest.raises(TopicError):
        message_from_publish(DEV, "$iothub/twin/GET/?$rid=1", b"", auth_method="sas", now_s=0)


def test_module_input_topic_carries_the_message_properties_in_its_bag() -> None:
    msg = Message(
        b"x",
        {"a b": "c"},
        {"messageId": "m1", "outputName": "o", "connectionDeviceId": "dev1", "connectionModuleId": "sensor"},
    )
    topic = module_input_topic(MOD, "in1", msg)
    assert topic == "devices/dev1/modules/filter/inputs/in1/$.mid=m1&$.cdid=dev1&$.cmid=sensor&a%20b=c"
    assert ("$.cmid", "sensor") in delivery_user_properties(msg)
    assert device_bound_topic(DEV, Message(b"", {}, {"messageId": "z"})) == "devices/dev1/messages/devicebound/$.mid=z"


def test_telemetry_topic_round_trips_through_the_parser() -> None:
    msg = Message(b"", {"k": "v"}, {"messageId": "1"})
    topic = telemetry_topic(MOD, msg)
    parsed = parse_publish_topic(topic)
    assert isinstance(parsed, TelemetryTopic)
    assert decode_property_bag(parsed.bag) == ({"messageId": "1"}, {"k": "v"})


def test_twin_response_topic_has_status_and_rid() -> None:
    assert twin_response_topic(200, "5") == "$iothub/twin/res/200/?$rid=5"
    assert twin_response_topic(204, "6", version=3) == "$iothub/twin/res/204/?$rid=6&$version=3"


@pytest.mark.parametrize(
    ("topic_filter", "topic", "matches"),
    [
        ("a/+/c", "a/b/c", True),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("a/+", "a/b/c", False),
        ("#", "$iothub/twin/res/200", False),
        ("$iothub/twin/res/#", "$iothub/twin/res/200/?$rid=1", True),
    ],
)
def test_topic_filters_match_as_mqtt_says(topic_filter: str, topic: str, matches: bool) -> None:
    assert topic_matches(topic_filter, topic) is matches


def test_a_device_publishes_only_to_its_own_topics() -> None:
    acl = Acl()
    assert acl.may_publish(DEV, "devices/dev1/messages/events/")
    assert acl.may_publish(DEV, "$iothub/twin/GET/?$rid=1")
    assert not acl.may_publish(DEV, "devices/dev2/messages/events/")
    assert not acl.may_publish(DEV, "devices/dev1/modules/filter/messages/events/")
    assert not acl.may_publish(DEV, "factory/x")


def test_a_module_publishes_only_as_itself() -> None:
    acl = Acl()
    assert acl.may_publish(MOD, "devices/dev1/modules/filter/messages/events/$.on=o")
    assert not acl.may_publish(MOD, "devices/dev1/messages/events/")
    assert not acl.may_publish(MOD, "devices/dev1/modules/other/messages/events/")


def test_subscriptions_are_limited_to_own_inputs_device_bound_and_twin() -> None:
    acl = Acl()
    assert acl.may_subscribe(MOD, "devices/dev1/modules/filter/inputs/#")
    assert acl.may_subscribe(MOD, "devices/dev1/modules/filter/#")
    assert acl.may_subscribe(MOD, "$iothub/twin/res/#")
    assert not acl.may_subscribe(MOD, "devices/dev1/modules/+/inputs/#")
    assert not acl.may_subscribe(MOD, "#")
    assert acl.may_subscribe(DEV, "devices/dev1/messages/devicebound/#")
    assert not acl.may_subscribe(DEV, "devices/dev2/messages/devicebound/#")


def test_grants_open_plain_topics_to_one_identity() -> None:
    acl = Acl(publish_grants={"dev1": ["factory/#"]}, subscribe_grants={"dev1": ["commands/dev1/#"]})
    assert acl.may_publish(DEV, "factory/line1/temp")
    assert not acl.may_publish(Identity.parse("dev2"), "factory/line1/temp")
    assert acl.may_subscribe(DEV, "commands/dev1/#")
    assert not acl.may_subscribe(DEV, "commands/#")


def test_session_id_and_partition_key_travel_in_the_bag_and_as_mqtt5_user_properties() -> None:
    from_bag = message_from_publish(
        DEV, "devices/dev1/messages/events/$.sid=ship%207&$.pk=ship%207", b"", auth_method="sas", now_s=0
    )
    assert from_bag.system_properties["sessionId"] == "ship 7"
    assert from_bag.system_properties["partitionKey"] == "ship 7"
    assert from_bag.properties == {}
    from_v5 = message_from_publish(
        DEV,
        "devices/dev1/messages/events/",
        b"",
        auth_method="sas",
        now_s=0,
        user_properties=[("$.sid", "s1"), ("$.pk", "p1")],
    )
    assert (from_v5.system_properties["sessionId"], from_v5.system_properties["partitionKey"]) == ("s1", "p1")
    assert from_v5.properties == {}


def test_session_id_and_partition_key_go_out_to_modules_under_the_same_names() -> None:
    msg = Message(b"", {}, {"sessionId": "s1", "partitionKey": "s1"})
    assert dict(decode_property_bag(encode_property_bag(msg.system_properties, {}))[0]) == msg.system_properties
    assert ("$.sid", "s1") in delivery_user_properties(msg)
    assert ("$.pk", "s1") in delivery_user_properties(msg)


def test_a_username_names_an_identity_with_or_without_its_query_part() -> None:
    assert username_identity("gw/dev1/filter/?api-version=2021-04-12", "dev1/filter") == MOD
    assert username_identity("gw/dev1", "dev1") == DEV
    assert username_identity("dev1", "dev1") == DEV  # the client id itself
    assert username_identity("gw/dev2", "dev1") != DEV  # the caller compares it with the client id
    for bad in ("just-a-name", "gw/", "a/b/c/d", "gw//dev1"):
        with pytest.raises(ValueError, match="username"):
            username_identity(bad, "dev1")


def test_method_responses_are_recognised() -> None:
    assert is_method_response("$iothub/methods/res/200/?$rid=1")
    assert not is_method_response("$iothub/twin/GET/?$rid=1")
