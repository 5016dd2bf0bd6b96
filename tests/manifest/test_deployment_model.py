"""The deployment model: every key known or refused by its path, every problem listed, Azure's mqttBroker as
grants, module twins, and what is accepted but not acted on."""

from __future__ import annotations

from typing import Any

import pytest

from edgehub.core import Identity
from edgehub.manifest import ManifestError, parse_deployment
from edgehub.runtime.deployment.settings import StartSettings, running_settings


def hub(**kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"schemaVersion": "1.2", "routes": {"r": "FROM /* INTO $upstream"}}
    doc.update(kw)
    return doc


def errors_of(document: Any) -> tuple[str, ...]:
    with pytest.raises(ManifestError) as err:
        parse_deployment(document)
    return err.value.errors


@pytest.mark.parametrize(
    ("document", "error"),
    [
        (
            hub(storeAndForwardConfiguration={"maxQueueByts": 1}),
            "storeAndForwardConfiguration.maxQueueByts: unknown key",
        ),
        (hub(routee={}), "routee: unknown key"),
        (hub(routes={"r": {"route": "FROM /* INTO $upstream", "prio": 1}}), "routes.r.prio: unknown key"),
        (hub(delivery={"retryPolicy": {"jiter": 0.1}}), "delivery.retryPolicy.jiter: unknown key"),
        (hub(delivery={"queuePolicy": {"maxBytes": 1}}), "delivery.queuePolicy.maxBytes: unknown key"),
        (
            hub(endpoints={"$upstream": {"queuePolicy": {"overflw": "x"}}}),
            "endpoints.$upstream.queuePolicy.overflw: unknown key",
        ),
        (hub(upstream={"partition": 2}), "upstream.partition: unknown key"),
        (hub(mqttBroker={"authorisations": []}), "mqttBroker.authorisations: unknown key"),
        (
            hub(
                mqttBroker={
                    "authorizations": [
                        {"identities": ["d"], "allow": [{"operations": ["mqtt:publish"], "resource": []}]}
                    ]
                }
            ),
            "mqttBroker.authorizations.0.allow.0.resource: unknown key",
        ),
        (
            hub(mqttBroker={"bridges": [{"endpoint": "$upstream", "settings": [], "x": 1}]}),
            "mqttBroker.bridges.0.x: unknown key",
        ),
        (
            hub(integrity={"header": {}, "signature": {"bytes": "", "algorithm": ""}, "y": 1}),
            "integrity.y: unknown key",
        ),
        (
            {"modulesContent": {"$edgeHub": {"properties.desired": hub()}, "m": {"properties.reported": {}}}},
            "modulesContent.m.properties.reported: unknown key",
        ),
    ],
)
def test_an_unknown_key_at_any_level_is_refused_naming_its_path(document: Any, error: str) -> None:
    assert error in errors_of(document)


def test_every_problem_is_listed_with_its_location_route_errors_included() -> None:
    errors = errors_of(
        hub(
            routes={"bad": "FROM /* INTO $nowhere", "alsoBad": {"route": "FROM /* INTO $upstream", "priority": 12}},
            storeAndForwardConfiguration={"timeToLiveSecs": "7200", "maxQueueByts": 1},
            endpoints={"not-an-endpoint": {}},
        )
    )
    assert any(e.startswith("routes.bad: unknown sink '$nowhere'") for e in errors), errors
    assert "routes.alsoBad.priority: Input should be less than or equal to 9" in errors
    assert "storeAndForwardConfiguration.timeToLiveSecs: Input should be a valid integer" in errors
    assert "storeAndForwardConfiguration.maxQueueByts: unknown key" in errors
    assert any(e.startswith("endpoints.not-an-endpoint: not an endpoint id") for e in errors), errors
    assert len(errors) == 5


def test_a_value_the_models_take_but_the_policy_refuses_is_an_error_in_the_manifests_words() -> None:
    d = parse_deployment(hub(delivery={"retryPolicy": {"minimumDelaySecs": 10, "maximumDelaySecs": 5}}))
    with pytest.raises(ManifestError) as err:
        running_settings(d.desired, StartSettings())
    assert err.value.errors == ("delivery.retryPolicy: need 0 <= minimumDelaySecs <= maximumDelaySecs",)


def test_every_endpoint_gets_its_own_effective_policy() -> None:
    d = parse_deployment(
        hub(
            delivery={
                "retryPolicy": {"maximumDelaySecs": 30},
                "maxDeliveryAttempts": 5,
                "queuePolicy": {"maxQueueMessages": 10},
            },
            endpoints={
                "$upstream": {"retryPolicy": {"maximumDelaySecs": 600}, "queuePolicy": {"overflow": "discardOldest"}},
                "/modules/m/inputs/i": {"maxDeliveryAttempts": 2},
            },
        )
    )
    s = running_settings(d.desired, StartSettings())
    up = s.executor_settings("$upstream")
    assert up.endpoint_retry_policy is not None
    assert up.endpoint_retry_policy.maximum_delay_s == 600
    assert up.max_delivery_attempts == 5
    assert s.executor_settings("/modules/m/inputs/i").max_delivery_attempts == 2
    assert s.executor_settings("/modules/other/inputs/i").retry_policy.maximum_delay_s == 30
    assert s.queue_policy("$upstream").max_messages == 10  # inherited from the hub's
    assert s.queue_policy("$upstream").overflow == "discardOldest"
    assert s.queue_policy("/modules/x/inputs/y").overflow == "rejectIncoming"


def test_ignore_endpoint_override_gives_every_endpoint_the_hubs_retry_policy() -> None:
    d = parse_deployment(
        hub(
            delivery={"retryPolicy": {"maximumDelaySecs": 30, "ignoreEndpointOverride": True}},
            endpoints={"$upstream": {"retryPolicy": {"maximumDelaySecs": 600}}},
        )
    )
    from edgehub.delivery.retry import effective_policy

    up = running_settings(d.desired, StartSettings()).executor_settings("$upstream")
    assert effective_policy(up.retry_policy, up.endpoint_retry_policy).maximum_delay_s == 30
    with pytest.raises(ManifestError, match=r"endpoints\.\$upstream\.retryPolicy: ignoreEndpointOverride is the hub's"):
        parse_deployment(hub(endpoints={"$upstream": {"retryPolicy": {"ignoreEndpointOverride": False}}}))


def test_mqtt_broker_authorizations_become_grants_with_variables_filled_per_identity() -> None:
    d = parse_deployment(
        hub(
            mqttBroker={
                "authorizations": [
                    {"identities": ["{{iot:identity}}"], "allow": [{"operations": ["mqtt:connect"]}]},
                    {
                        "identities": ["{{iot:identity}}"],
                        "allow": [
                            {"operations": ["mqtt:publish"], "resources": ["local/{{iot:device_id}}/{{iot:module_id}}"]}
                        ],
                    },
                    {
                        "identities": ["myhub.azure-devices.net/sensor_1", "gw/mod"],
                        "allow": [{"operations": ["mqtt:subscribe"], "resources": ["events/#"]}],
                    },
                ]
            }
        )
    )
    device, module = Identity.parse("sensor_1"), Identity.parse("gw/mod")
    publish = [g for g in d.grants if g.operation == "publish"]
    assert [g.applies_to(device) for g in publish] == [False]  # {{iot:module_id}}: modules only
    assert publish[0].topic_filter(module) == "local/gw/mod"
    subscribe = [g for g in d.grants if g.operation == "subscribe"]
    assert [g.identity for g in subscribe] == ["sensor_1", "gw/mod"]
    assert d.unsupported == ()


def test_deny_rules_and_unknown_variables_are_refused_by_their_path() -> None:
    errors = errors_of(
        hub(
            mqttBroker={
                "authorizations": [
                    {"identities": ["d"], "deny": [{"operations": ["mqtt:connect"]}]},
                    {
                        "identities": ["d"],
                        "allow": [{"operations": ["mqtt:publish"], "resources": ["{{iot:this_device_id}}/x"]}],
                    },
                    {"identities": ["d"], "allow": [{"operations": ["mqtt:publish"], "resources": ["a/#/b"]}]},
                ]
            }
        )
    )
    assert errors[0].startswith("mqttBroker.authorizations.0.deny: deny rules are not supported")
    assert errors[1].startswith(
        "mqttBroker.authorizations.1.allow.0.resources: resource '{{iot:this_device_id}}/x': unknown variable"
    )
    assert errors[2].startswith(
        "mqttBroker.authorizations.2.allow.0.resources: resource 'a/#/b': '#' must be a whole level"
    )


def test_parts_accepted_but_not_acted_on_are_named() -> None:
    d = parse_deployment(
        {
            "modulesContent": {
                "$edgeAgent": {"properties.desired": {"schemaVersion": "1.1"}},
                "$edgeHub": {
                    "properties.desired": hub(
                        schemaVersion="1.3",
                        mqttBroker={
                            "bridges": [{"endpoint": "$upstream", "settings": [{"direction": "in", "topic": "t"}]}]
                        },
                        integrity={"header": {}, "signature": {"bytes": "AA==", "algorithm": "ES256"}},
                    )
                },
            }
        }
    )
    assert [u.split(" ")[0] for u in d.unsupported] == ["modulesContent.$edgeAgent", "mqttBroker.bridges", "integrity"]
    old = parse_deployment(hub(schemaVersion="1.1", mqttBroker={"authorizations": []}))
    assert old.unsupported[0].startswith("mqttBroker (needs schemaVersion 1.2")


def test_module_twins_come_from_modules_content() -> None:
    d = parse_deployment(
        {
            "modulesContent": {
                "$edgeHub": {"properties.desired": hub()},
                "filter": {"properties.desired": {"threshold": 25, "nested": {"a": [1, 2]}}},
            }
        }
    )
    assert d.module_twins == {"filter": {"threshold": 25, "nested": {"a": [1, 2]}}}
    assert (
        "modulesContent.bad/id: not a module id"
        in errors_of(
            {"modulesContent": {"$edgeHub": {"properties.desired": hub()}, "bad/id": {"properties.desired": {}}}}
        )[0]
    )


def test_version_is_read_from_the_desired_properties() -> None:
    assert parse_deployment(hub(**{"$version": 7, "$metadata": {"$lastUpdated": "x"}})).version == 7
    assert "$version: Input should be a valid integer" in errors_of(hub(**{"$version": "7"}))
