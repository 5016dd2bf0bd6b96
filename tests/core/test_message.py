from __future__ import annotations

import pytest

import edgehub
import edgehub.core
import edgehub.manifest
import edgehub.routing
from edgehub import Message
from edgehub.core import Identity


@pytest.mark.parametrize(
    ("system_properties", "source"),
    [
        ({}, "/messages"),
        ({"connectionDeviceId": "d1"}, "/messages"),
        ({"connectionDeviceId": "d1", "connectionModuleId": "m1"}, "/messages/modules/m1"),
        (
            {"connectionDeviceId": "d1", "connectionModuleId": "m1", "outputName": "o1"},
            "/messages/modules/m1/outputs/o1",
        ),
        ({"connectionDeviceId": "d1", "outputName": "o1"}, "/messages"),
        (
            {"connectionModuleId": "m1", "messageType": "twinChangeNotification"},
            "/twinChangeNotifications",
        ),
    ],
)
def test_message_source_follows_the_route_language_table(system_properties: dict[str, str], source: str) -> None:
    assert Message(body=b"", system_properties=system_properties).source == source


def test_with_system_properties_keeps_the_rest_and_rederives_the_source() -> None:
    m = Message(body=b"x", properties={"a": "1"}, system_properties={"connectionModuleId": "m1"})
    m2 = m.with_system_properties(outputName="o", edgeMessageId="e1")
    assert m2.source == "/messages/modules/m1/outputs/o"
    assert m2.edge_message_id == "e1"
    assert m2.properties == {"a": "1"}
    assert m.source == "/messages/modules/m1"


def test_message_body_must_be_bytes() -> None:
    with pytest.raises(TypeError):
        Message(body="text")  # type: ignore[arg-type]


def test_size_counts_body_and_properties() -> None:
    m = Message(body=b"12345", properties={"ab": "cd", "n": None}, system_properties={"to": "x"})
    assert m.size_bytes() == 5 + 4 + 1 + 3


def test_identity_parses_and_prints_device_and_module() -> None:
    assert Identity.parse("d1/m1").module_id == "m1"
    assert str(Identity.parse("d1")) == "d1"
    with pytest.raises(ValueError):
        Identity.parse("")


def test_all_lists_are_complete() -> None:
    for module in (edgehub, edgehub.core, edgehub.routing, edgehub.manifest):
        public = {n for n in vars(module) if not n.startswith("_") and n[0].isupper()}
        assert public <= set(module.__all__), public - set(module.__all__)
