"""Azure IoT Edge's public sample manifests (tests/manifest/azure_samples/SOURCES.md says where each is from, at
which commit) load unchanged, or are refused with an error naming the part edgehub does not support."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgehub.manifest import ManifestError, parse_deployment, read_manifest_file

SAMPLES = Path(__file__).parent / "azure_samples"


def load(name: str) -> object:
    return read_manifest_file(SAMPLES / name)


def test_the_quickstart_loads_and_names_what_schema_1_0_ignores() -> None:
    d = parse_deployment(load("quickstart_deployment.template.json"))
    assert [r.result.endpoint for r in d.router.routes] == ["$upstream"]
    assert any(u.startswith("mqttBroker (needs schemaVersion 1.2") for u in d.unsupported)
    assert any(u.startswith("modulesContent.$edgeAgent") for u in d.unsupported)
    assert d.grants == ()


def test_module_to_module_routes_into_a_module_input() -> None:
    d = parse_deployment(load("module_to_module_deployment.template.json"))
    assert {r.result.endpoint for r in d.router.routes} == {"$upstream", "/modules/tempFilter/inputs/input1"}


def test_the_nested_top_layer_loads_with_schema_1_2() -> None:
    d = parse_deployment(load("nestededge_topLayerBaseDeployment_mqtt.json"))
    assert d.desired.schemaVersion == "1.2"
    assert d.grants == ()  # mqtt:connect only: every authenticated identity connects anyway
    assert [u.split(" ")[0] for u in d.unsupported] == ["modulesContent.$edgeAgent"]


def test_the_documented_default_connect_policy_loads() -> None:
    d = parse_deployment(load("how-to-publish-subscribe.default-connect-policy.json"))
    assert d.desired.mqttBroker is not None
    assert len(d.desired.mqttBroker.authorizations) == 1


def test_the_documented_policy_with_a_deny_rule_is_refused_naming_it() -> None:
    with pytest.raises(ManifestError) as err:
        parse_deployment(load("how-to-publish-subscribe.authorization-policy.json"))
    assert err.value.errors == (
        "mqttBroker.authorizations.0.deny: deny rules are not supported by edgehub "
        "(grants only add to the built-in topics)",
    )
