"""The twin and method conventions (``twin_methods.py``) as pure functions: whatever a client's message holds, a
twin request parses or raises ``ValueError`` (answered 400), a method answer parses or raises ``ValueError``
(rejected), and an answer to any request can be encoded (Hypothesis over the sections an AMQP message may carry)."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from proton import Message as AmqpMessage
from proton import int32, symbol

from protocol_heads.amqp.twin_methods import (
    METHOD_NAME,
    METHOD_STATUS,
    TwinOperation,
    desired_patch_message,
    method_request_message,
    parse_method_response,
    parse_twin_request,
    twin_response,
)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=40),
    st.binary(max_size=40),
    st.sampled_from(
        ["GET", "PATCH", "PUT", "DELETE", "/properties/reported", "/notifications/twin/properties/desired"]
    ),
)
_ids = st.one_of(
    st.none(), st.text(max_size=40), st.integers(min_value=0, max_value=2**63 - 1), st.uuids(), st.binary(max_size=16)
)
_bodies = st.one_of(
    st.none(), st.binary(max_size=200), st.text(max_size=200), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)
)


def _wire(message: AmqpMessage) -> AmqpMessage:
    """What the head decodes of ``message`` once it crossed the wire."""
    decoded = AmqpMessage()
    decoded.decode(message.encode())
    return decoded


@given(
    annotations=st.dictionaries(st.sampled_from(["operation", "resource", "x"]), _scalars, max_size=3),
    cid=_ids,
    body=_bodies,
)
def test_any_twin_request_parses_or_raises_value_error_and_its_answer_encodes(
    annotations: dict[str, Any], cid: object, body: object
) -> None:
    message = AmqpMessage(body=body, correlation_id=cid)
    message.annotations = {symbol(k): v for k, v in annotations.items()}
    received = _wire(message)
    try:
        request = parse_twin_request(received)
    except ValueError:
        answer = twin_response(received.correlation_id, 400)
    else:
        assert isinstance(request.operation, TwinOperation)
        answer = twin_response(request.correlation_id, 200, b'{"desired": {}}', version=3)
    back = _wire(answer)
    assert back.annotations["status"] in (200, 400)
    echoed = back.correlation_id
    if isinstance(cid, str | int | uuid.UUID | bytes):
        assert (bytes(echoed) if isinstance(echoed, memoryview) else echoed) == cid
    else:
        assert echoed is None


def test_a_reported_patch_request_parses_with_its_body_and_a_get_ignores_its_body() -> None:
    patch = AmqpMessage(body=b'{"a": 1}', inferred=True, correlation_id="c")
    patch.annotations = {symbol("operation"): "PATCH", symbol("resource"): "/properties/reported"}
    request = parse_twin_request(_wire(patch))
    assert (request.operation, request.correlation_id, request.body) == (TwinOperation.PATCH_REPORTED, "c", b'{"a": 1}')
    get = AmqpMessage(body=b" ", inferred=True, correlation_id="g")
    get.annotations = {symbol("operation"): "GET"}
    assert parse_twin_request(_wire(get)).body == b""


@given(status=_scalars, cid=_ids, body=_bodies)
def test_any_method_answer_parses_or_raises_value_error(status: object, cid: object, body: object) -> None:
    message = AmqpMessage(body=body, correlation_id=cid)
    message.properties = {METHOD_STATUS: status}
    try:
        rid, code, payload = parse_method_response(_wire(message))
    except ValueError:
        return
    assert isinstance(rid, str)
    assert 0 <= code < 1_000_000
    assert isinstance(payload, bytes)


def test_a_method_call_goes_out_as_iot_hub_sends_it_and_its_answer_comes_back_however_the_uuid_is_echoed() -> None:
    call = _wire(method_request_message("1f", "reboot", b'{"in": 5}'))
    # A UUID, as IoT Hub sends it: the C SDK rejects any other type of correlation id.
    assert call.correlation_id == uuid.UUID("00000000-0000-0000-0000-00000000001f")
    assert call.properties == {METHOD_NAME: "reboot"}
    assert bytes(call.body) == b'{"in": 5}'
    # The C SDK echoes the UUID; Node's its text form; a client might send its 16 bytes.
    for echoed in (call.correlation_id, str(call.correlation_id), call.correlation_id.bytes):
        answer = AmqpMessage(body=b'"ok"', inferred=True, correlation_id=echoed)
        answer.properties = {METHOD_STATUS: 200}
        assert parse_method_response(_wire(answer)) == ("1f", 200, b'"ok"')


def test_a_request_id_that_is_no_hex_counter_goes_out_as_text_and_comes_back() -> None:
    call = _wire(method_request_message("call-7", "reboot", b"{}"))
    assert call.correlation_id == "call-7"
    answer = AmqpMessage(body=b"{}", inferred=True, correlation_id="call-7")
    answer.properties = {METHOD_STATUS: 200}
    assert parse_method_response(_wire(answer))[0] == "call-7"


def test_a_desired_patch_has_no_correlation_id_and_its_version_annotated() -> None:
    patch = _wire(desired_patch_message(b'{"t": 1, "$version": 4}', 4))
    assert patch.correlation_id is None
    assert patch.annotations == {"version": 4}
    assert bytes(patch.body) == b'{"t": 1, "$version": 4}'


def test_a_twin_answer_carries_the_types_the_c_sdk_checks() -> None:
    # iothubtransport_amqp_twin_messenger refuses an answer unless its annotation keys are symbols, "status" an AMQP
    # int and "version" a long, and its correlation id the string it sent; its body data or none.
    answer = _wire(twin_response("b3c9-uuid-text", 204, version=7))
    assert answer.correlation_id == "b3c9-uuid-text"
    assert all(type(key) is symbol for key in answer.annotations)
    assert type(answer.annotations["status"]) is int32
    assert type(answer.annotations["version"]) is int  # proton's long
    assert answer.body is None
    patch = _wire(desired_patch_message(b"{}", 9))
    assert type(patch.annotations["version"]) is int
