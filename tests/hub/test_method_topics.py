"""Direct methods' values and the topics that carry them: addressed calls parsed or refused, IoT Hub's names
and error bodies, and the device endpoint id's spelling."""

from __future__ import annotations

import json

import pytest

from edgehub.core import Identity
from edgehub.core.endpoints import device_endpoint, parse_device_endpoint, parse_module_endpoint
from edgehub.core.methods import (
    MAX_RID_LENGTH,
    MAX_TARGET_ID_LENGTH,
    MethodErrorCode,
    error_payload,
    method_name_problem,
    parse_addressed_call,
)
from edgehub.mqtt.encoder import string_field
from edgehub.upstream.mqtt.cloud import subscriptions
from protocol_heads.mqtt.iothub import method_request_topic, parse_method_response


@pytest.mark.parametrize(
    ("topic", "target", "name", "rid", "timeout_s", "answer"),
    [
        (
            "$iothub/dev1/methods/POST/reboot/?$rid=7",
            "dev1",
            "reboot",
            "7",
            30.0,
            "$iothub/dev1/methods/res/200/?$rid=7",
        ),
        (
            "$iothub/edge/filter/methods/POST/set%20rate/?$rid=a1&$timeout=12.5",
            "edge/filter",
            "set rate",
            "a1",
            12.5,
            "$iothub/edge/filter/methods/res/200/?$rid=a1",
        ),
        (
            "$iothub/d/m/methods/POST/x/?$timeout=oops&$rid=r",
            "d/m",
            "x",
            "r",
            None,
            "$iothub/d/m/methods/res/200/?$rid=r",
        ),
    ],
)
def test_an_addressed_call_names_its_target_name_rid_timeout_and_answer_topic(
    topic: str, target: str, name: str, rid: str, timeout_s: float | None, answer: str
) -> None:
    call = parse_addressed_call(topic)
    assert call is not None
    assert call.target == Identity.parse(target)
    assert (call.name, call.rid, call.timeout_s) == (name, rid, timeout_s)
    assert call.response_topic(200) == answer


@pytest.mark.parametrize(
    "topic",
    [
        "$iothub/dev1/methods/POST/reboot/",  # no $rid: nobody could be answered
        "$iothub/dev1/methods/POST/reboot/?$rid=",
        "$iothub/methods/POST/reboot/?$rid=1",  # IoT Hub's own request topic: addressed to no one
        "$iothub/twin/GET/?$rid=1",
        "$iothub/a/b/c/methods/POST/x/?$rid=1",  # three levels: no identity
        "$iothub/+/methods/POST/x/?$rid=1",
        "$iothub/dev1/methods/res/200/?$rid=1",
        "$iothub/dev1/methods/POST/x/?$rid=" + "r" * 129,
        "$iothub/" + "d" * 129 + "/methods/POST/x/?$rid=1",  # no IoT Hub id is longer than 128
        "$iothub/dev1/" + "m" * 129 + "/methods/POST/x/?$rid=1",
        "devices/dev1/messages/events/",
    ],
)
def test_anything_else_is_not_an_addressed_call(topic: str) -> None:
    assert parse_addressed_call(topic) is None


def test_the_answer_to_any_call_that_parses_fits_an_mqtt_topic() -> None:
    # The longest call that parses: ids and request id at their bounds, each character four bytes of UTF-8 (the
    # request id percent-encoded, as a query value is), answered with the longest status a target can give.
    widest = "\U0001f600"
    device, module = widest * MAX_TARGET_ID_LENGTH, widest * MAX_TARGET_ID_LENGTH
    rid = "%F0%9F%98%80" * MAX_RID_LENGTH
    call = parse_addressed_call(f"$iothub/{device}/{module}/methods/POST/x/?$rid={rid}")
    assert call is not None
    topic = call.response_topic(999_999)
    assert len(topic.encode()) == 8 + 512 + 1 + 512 + len("/methods/res/999999/?$rid=") + 512
    string_field(topic)  # the MQTT encoder's own rule: raises UnencodableField past 65,535 bytes
    assert len(topic.encode()) < 2_000


GOOD_METHOD_NAMES = ["reboot", "get_Temp-2.x"]
BAD_METHOD_NAMES = ["", "a/b", "a b", "$x", "é", "x" * 129, "a?b"]


@pytest.mark.parametrize(
    ("name", "ok"), [(n, True) for n in GOOD_METHOD_NAMES] + [(n, False) for n in BAD_METHOD_NAMES]
)
def test_method_names_follow_iot_hubs_character_rules(name: str, ok: bool) -> None:
    assert (method_name_problem(name) is None) is ok


def test_an_error_body_is_iot_hubs_json_and_its_status_is_the_codes_first_three_digits() -> None:
    body = json.loads(error_payload(MethodErrorCode.DEVICE_NOT_ONLINE, now_s=0.0))
    assert body["errorCode"] == 404103
    assert body["timestampUtc"] == "1970-01-01T00:00:00Z"
    assert [c.status for c in MethodErrorCode] == [400, 404, 404, 429, 504]


def test_the_method_topics_a_client_sees_parse_back() -> None:
    assert method_request_topic("reboot", "1f") == "$iothub/methods/POST/reboot/?$rid=1f"
    assert parse_method_response("$iothub/methods/res/201/?$rid=1f") == (201, "1f")
    assert parse_method_response("$iothub/methods/res/2x/?$rid=1f") is None
    assert parse_method_response("$iothub/methods/res/200/?$rid=") is None
    assert parse_method_response("$iothub/methods/res/1234567/?$rid=1") is None


def test_a_device_endpoint_id_parses_back_and_is_no_module_endpoint() -> None:
    endpoint = device_endpoint("dev1")
    assert endpoint == "/devices/dev1/messages/devicebound"
    assert parse_device_endpoint(endpoint) == "dev1"
    assert parse_module_endpoint(endpoint) is None
    for bad in ("/devices//messages/devicebound", "/devices/a/messages/events", "/modules/m/inputs/i", "$upstream"):
        assert parse_device_endpoint(bad) is None
    with pytest.raises(ValueError):
        device_endpoint("a/b")


def test_the_upstream_subscribes_for_each_device_and_never_with_a_wildcard_from_a_device_id() -> None:
    assert subscriptions(["dev1", "a+b", "x#", ""]) == [
        ("devices/dev1/messages/devicebound/#", 1),
        ("$iothub/dev1/methods/POST/#", 0),
        ("$iothub/dev1/+/methods/POST/#", 0),
    ]
