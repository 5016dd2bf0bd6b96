"""Every key the ``$edgeHub`` desired properties accept takes effect, whichever way it comes (the manifest file, the
admin API, the cloud's twin), and still does after a restart: one case per key, a test that every key the models
accept has its case, and one that the case agrees with the manifest page's "live" column.

Each case sets its key over a base deployment on a running hub (a real ``EdgeHub`` over RocksDB in ``tmp_path``,
its ``DeploymentController`` checking in process with ``plan_of``, the check's own code), then reads the key's
effect where the hub acts on it: the store's policies and quota, the executors' settings, the router, the ACL's
grants, the delivery window, the reported properties; for a **start** key, the settings the upstream is built with
(``effective_settings``, as ``serve`` computes them; with ``upstream.links``, the ``LinkedUpstream`` lanes that
``build_linked_lanes`` makes for ``serve`` to start: each link's transport settings, its spec, the budget ledger).
Every effect is read before too, so a key that does nothing fails its case. Then the hub stops and starts again
over the same store and the unchanged file, the way ``serve`` does (``start_point``): a **live** key's effect is
still there, a **start** key's is now in force, and nothing is left in ``restartRequired`` (which names the
upstream key that changed; a link's key by its list, ``upstream.links``). An **accepted** key is named in
``unsupported``; a **refused** one is answered 400 with its path, and changes nothing.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgehub.core import Identity, Message
from edgehub.hub.facade import EdgeHub
from edgehub.manifest.documents import read_manifest_file
from edgehub.routing import Router
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.links import build_linked_lanes
from edgehub.runtime.compose.settings import EffectiveSettings, effective_settings
from edgehub.runtime.compose.upstream import lane_ids
from edgehub.runtime.deployment.check import plan_of
from edgehub.runtime.deployment.controller import DeploymentController, DesiredStatus, start_point
from edgehub.runtime.deployment.plan import DeploymentPlan
from edgehub.runtime.deployment.settings import StartSettings
from edgehub.runtime.deployment.state import merge_patch
from edgehub.store.rocks import open_rocks_store
from edgehub.upstream.landing import LandingZone
from edgehub.upstream.links import LinkedUpstream, LinkSpec
from edgehub.upstream.mqtt.settings import MqttProtocol, MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.upload_transport import UploadTransport
from tests.docs.manifest_keys import manifest_keys
from tests.docs.test_manifest_page import rows

pytestmark = pytest.mark.timeout(60)

UP = "$upstream"
E = "/modules/m/inputs/in"
BASE: dict[str, Any] = {
    "schemaVersion": "1.1",
    "routes": {"up": "FROM /messages/* INTO $upstream", "m": f"FROM /messages/* INTO BrokeredEndpoint('{E}')"},
    # mqttBroker under schema 1.1 is ignored (as Azure IoT Edge ignores it) and named in unsupported
    "mqttBroker": {"authorizations": []},
}
UPSTREAM = MqttUpstreamSettings(host="broker.test", client_id="gw", hub_id="gw")
# What the links' secrets are read from: the environment serve would pass (os.environ there), and files the test
# writes into tmp_path (a patch's "{tmp}" is that folder).
ENV = {"EDGEHUB_KEYS_SAT_PASSWORD": "from-env", "EDGEHUB_KEYS_SAT_SAS": "SharedAccessSignature sr=env"}
SECRET_FILES = {"sat-password": "from-file", "sat-sas": "SharedAccessSignature sr=file"}


@dataclass(frozen=True)
class Seen:
    """What a case reads its effect from: the running hub, its controller, the last update's answer, and the
    settings the hub's upstream was built with at its start."""

    hub: EdgeHub
    controller: DeploymentController
    status: DesiredStatus | None
    effective: EffectiveSettings
    links: LinkedUpstream | None  # the first lane as built from upstream.links at the start (None: no links)

    @property
    def reported(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(json.dumps(self.controller.reported()))  # as it goes out: JSON
        return out

    def executor(self, endpoint: str) -> Any:
        return self.hub.executor_settings_for(endpoint)


@dataclass(frozen=True)
class Case:
    how: str  # live | start | accepted | refused: the manifest page's column
    patch: dict[str, Any]  # a JSON merge patch over BASE that sets the key
    effect: Callable[[Seen], object]
    expected: object


def live(patch: dict[str, Any], effect: Callable[[Seen], object], expected: object) -> Case:
    return Case("live", patch, effect, expected)


def start(patch: dict[str, Any], effect: Callable[[Seen], object], expected: object) -> Case:
    return Case("start", patch, effect, expected)


def unsupported(s: Seen) -> list[str]:
    return [u.split(" ")[0] for u in s.reported["unsupported"]]


def refused(path: str) -> Callable[[Seen], object]:
    def effect(s: Seen) -> object:
        return s.status is not None and s.status.code == 400 and any(e.startswith(path) for e in s.status.errors)

    return effect


def grants(operation: str, identity_id: str) -> Callable[[Seen], object]:
    def effect(s: Seen) -> object:
        live_grants = s.controller.publish_grants if operation == "publish" else s.controller.subscribe_grants
        return list(live_grants.get(identity_id, []))

    return effect


def route(name: str, part: str) -> Callable[[Seen], object]:
    def effect(s: Seen) -> object:
        found = [r for r in s.hub.router.routes if r.name == name]
        if not found:
            return None
        return {"priority": found[0].priority, "ttl": found[0].ttl_s}[part]

    return effect


def endpoint_retry(field: str) -> Callable[[Seen], object]:
    def effect(s: Seen) -> object:
        override = s.executor(E).endpoint_retry_policy
        return None if override is None else getattr(override, field)

    return effect


def hub_retry(field: str) -> Callable[[Seen], object]:
    def effect(s: Seen) -> object:
        return getattr(s.executor(UP).retry_policy, field)

    return effect


def hub_queue(field: str) -> Callable[[Seen], object]:
    def effect(s: Seen) -> object:
        return getattr(s.hub.store.default_policy, field)

    return effect


def endpoint_queue(field: str) -> Callable[[Seen], object]:
    def effect(s: Seen) -> object:
        policy = s.hub.store.endpoint_policies.get(E)
        return None if policy is None else getattr(policy, field)

    return effect


def transport(field: str) -> Callable[[Seen], object]:
    def effect(s: Seen) -> object:
        return getattr(s.effective.transport, field)

    return effect


def linked(*others: dict[str, Any], **keys: Any) -> dict[str, Any]:
    """A patch that gives the hub one link, "sat", with ``keys`` (then ``others``)."""
    return {"upstream": {"links": [{"name": "sat", "address": "127.0.0.1:1883", **keys}, *others]}}


def link_spec(read: Callable[[LinkSpec], object]) -> Callable[[Seen], object]:
    def effect(s: Seen) -> object:
        return None if s.links is None else read(s.links.specs[0])

    return effect


def link_mqtt(read: Callable[[MqttUpstreamSettings], object]) -> Callable[[Seen], object]:
    """What the first link's MQTT transport was built with."""

    def effect(s: Seen) -> object:
        if s.links is None or not isinstance(t := s.links.transports[0], MqttUpstream):
            return None
        return read(t.settings)

    return effect


def link_tls(field: str) -> Callable[[Seen], object]:
    """The first link's TLS file ``field``, and whether its bytes are counted with TLS's overhead."""

    def effect(s: Seen) -> object:
        tls = link_mqtt(lambda m: m.tls)(s)
        return None if tls is None or s.links is None else (getattr(tls, field), s.links.specs[0].tls)

    return effect


def link_budget(field: str) -> Callable[[Seen], object]:
    """``field`` of each of the link's budgets as the ledger counts them, day first (None: no budget)."""

    def effect(s: Seen) -> object:
        budgets = () if s.links is None else s.links.ledger.budgets("sat")
        return [getattr(b, field) for b in budgets] or None

    return effect


def link_upload(s: Seen) -> object:
    """The first link's kind and, for an upload, where it writes."""
    if s.links is None:
        return None
    t = s.links.transports[0]
    if isinstance(t, UploadTransport) and isinstance(t.writer, LandingZone):
        return ("upload", t.writer.url)
    return (type(t).__name__, None)


UPLOAD = {"upstream": {"links": [{"name": "sat", "transport": "upload", "url": "memory://edgehub-keys/sat"}]}}


def saf(**keys: Any) -> dict[str, Any]:
    return {"storeAndForwardConfiguration": keys}


def statement(identities: tuple[str, ...] | list[str] = ("dev1",), **rule: Any) -> dict[str, Any]:
    allow = {"operations": ["mqtt:publish"], "resources": ["x/y"], **rule}
    who = {"identities": list(identities), "allow": [allow]}
    return {"schemaVersion": "1.2", "mqttBroker": {"authorizations": [who]}}


def denied(**rule: Any) -> dict[str, Any]:
    deny = {"operations": ["mqtt:publish"], "resources": ["x/y"], **rule}
    return {"schemaVersion": "1.2", "mqttBroker": {"authorizations": [{"identities": ["dev1"], "deny": [deny]}]}}


BRIDGES = {
    "schemaVersion": "1.2",
    "mqttBroker": {
        "bridges": [
            {
                "endpoint": "$upstream",
                "settings": [{"direction": "in", "topic": "t/#", "inPrefix": "a/", "outPrefix": "b/"}],
            }
        ]
    },
}
INTEGRITY = {
    "integrity": {
        "header": {"signercert": ["MIIB"], "intermediatecacert": ["MIIC"]},
        "signature": {"bytes": "c2lnbmF0dXJl", "algorithm": "ES256"},
    }
}
RETRY = {  # key: (value set, the RetryPolicy field, the value it holds then)
    "retriesWithNoDelay": (3, "retries_with_no_delay", 3),
    "minimumDelayRetries": (2, "minimum_delay_retries", 2),
    "minimumDelaySecs": (5, "minimum_delay_s", 5.0),
    "maximumDelaySecs": (120, "maximum_delay_s", 120.0),
    "backoffRetries": (3, "backoff_retries", 3),
    "backoffFunction": ("linear", "backoff_function", "linear"),
    "maximumDelayRetries": (4, "maximum_delay_retries", 4),
    "jitter": (0.5, "jitter", 0.5),
}
QUEUE = {  # key: (value set, the QueuePolicy field, the value it holds then)
    "maxMessageSizeBytes": (500_000, "max_message_size_bytes", 500_000),
    "maxQueueBytes": (1_000_000, "max_bytes", 1_000_000),
    "maxQueueMessages": (100, "max_messages", 100),
    "overflow": ("discardOldest", "overflow", "discardOldest"),
    "enqueueTimeoutSecs": (3, "enqueue_timeout_s", 3.0),
}
LINK = {  # upstream key: (value set, the MqttUpstreamSettings field, the value it holds then)
    "wireMode": ("message", "wire_mode", "message"),
    "maxUplinkBps": (32_000, "max_uplink_bps", 32_000.0),
    "maxBatchBytes": (2_048, "max_batch_bytes", 2_048),
    "lingerMs": (50, "linger_s", 0.05),
    "maxInflightBytes": (65_536, "max_inflight_bytes", 65_536),
    "linkRateBps": (128_000, "link_rate_bps", 128_000.0),
    "linkRttMs": (300, "link_rtt_s", 0.3),
    "compression": ("zstd", "compression", "zstd"),
    "maxPacketBytes": (2_048, "max_packet_bytes", 2_048),
    "brokerMaxPacketBytes": (4_096, "broker_max_packet_bytes", 4_096),
}

CASES: dict[str, Case] = {
    "schemaVersion": live({"schemaVersion": "1.2"}, unsupported, []),
    "routes": live({"routes": {"up": None}}, lambda s: sorted(r.name for r in s.hub.router.routes), ["m"]),
    "routes.<name>": live(
        {"routes": {"x": "FROM /messages/* INTO $upstream"}},
        lambda s: sorted(r.name for r in s.hub.router.routes),
        ["m", "up", "x"],
    ),
    "routes.<name>.route": live(
        {"routes": {"up": {"route": "FROM /messages/* WHERE a = 'b' INTO $upstream"}}},
        lambda s: s.reported["running"]["routes"]["up"]["route"],
        "FROM /messages/* WHERE a = 'b' INTO $upstream",
    ),
    "routes.<name>.priority": live(
        {"routes": {"up": {"route": "FROM /messages/* INTO $upstream", "priority": 2}}}, route("up", "priority"), 2
    ),
    "routes.<name>.timeToLiveSecs": live(
        {"routes": {"up": {"route": "FROM /messages/* INTO $upstream", "timeToLiveSecs": 90}}}, route("up", "ttl"), 90
    ),
    "storeAndForwardConfiguration.timeToLiveSecs": live(
        saf(timeToLiveSecs=60), lambda s: s.hub.store.default_ttl_s, 60
    ),
    "storeAndForwardConfiguration.maxStoreBytes": live(
        saf(maxStoreBytes=10_000_000), lambda s: s.hub.store.store_quota.max_bytes, 10_000_000
    ),
    "storeAndForwardConfiguration.maxStoreMessages": live(
        saf(maxStoreMessages=5_000), lambda s: s.hub.store.store_quota.max_messages, 5_000
    ),
    "storeAndForwardConfiguration.identityShare": live(
        saf(identityShare=0.5), lambda s: s.hub.store.store_quota.identity_share, 0.5
    ),
    "storeAndForwardConfiguration.fsync": live(saf(fsync="none"), lambda s: s.hub.store.fsync, "none"),
    "storeAndForwardConfiguration.fsyncIntervalMs": live(
        saf(fsync="interval", fsyncIntervalMs=50), lambda s: s.reported["running"]["fsyncIntervalMs"], 50
    ),
    "storeAndForwardConfiguration.cleanupIntervalSecs": live(
        saf(cleanupIntervalSecs=5), lambda s: s.executor(E).cleanup_interval_s, 5.0
    ),
    "storeAndForwardConfiguration.cleanupMode": live(
        saf(cleanupMode="entireQueue"), lambda s: s.executor(E).check_entire_queue_on_cleanup, True
    ),
    "mqttBroker.authorizations[].identities": live(
        statement(identities=["hub.test/dev2"]), grants("publish", "dev2"), ["x/y"]
    ),
    "mqttBroker.authorizations[].allow[].operations": live(
        statement(operations=["mqtt:subscribe"]), grants("subscribe", "dev1"), ["x/y"]
    ),
    "mqttBroker.authorizations[].allow[].resources": live(
        statement(resources=["a/{{iot:device_id}}/#"]), grants("publish", "dev1"), ["a/dev1/#"]
    ),
    "mqttBroker.authorizations[].deny[].operations": Case(
        "refused", denied(), refused("mqttBroker.authorizations.0.deny"), True
    ),
    "mqttBroker.authorizations[].deny[].resources": Case(
        "refused", denied(resources=["z/#"]), refused("mqttBroker.authorizations.0.deny"), True
    ),
    **{
        f"mqttBroker.bridges[].{key}": Case("accepted", BRIDGES, unsupported, ["mqttBroker.bridges"])
        for key in (
            "endpoint",
            "settings[].direction",
            "settings[].topic",
            "settings[].inPrefix",
            "settings[].outPrefix",
        )
    },
    **{
        f"integrity.{key}": Case("accepted", INTEGRITY, unsupported, ["mqttBroker", "integrity"])
        for key in ("header.signercert", "header.intermediatecacert", "signature.bytes", "signature.algorithm")
    },
    "upstream.partitions": start({"upstream": {"partitions": 2}}, lambda s: s.effective.upstream.partitions, 2),
    "upstream.duplicateDetection": start(
        {"upstream": {"duplicateDetection": True}}, lambda s: s.effective.upstream.duplicate_detection, True
    ),
    "upstream.duplicateDetectionWindowSecs": start(
        {"upstream": {"duplicateDetectionWindowSecs": 60}}, lambda s: s.effective.upstream.duplicate_window_s, 60.0
    ),
    **{
        f"upstream.{key}": start({"upstream": {key: value}}, transport(field), held)
        for key, (value, field, held) in LINK.items()
    },
    "upstream.links[].name": start(linked(), lambda s: s.links and [st.name for st in s.links.links_status()], ["sat"]),
    "upstream.links[].transport": start(UPLOAD, lambda s: s.links and type(s.links.transports[0]), UploadTransport),
    "upstream.links[].url": start(UPLOAD, link_upload, ("upload", "memory://edgehub-keys/sat")),
    "upstream.links[].address": start(
        linked(address="sat.example:8883"), link_mqtt(lambda m: (m.host, m.port)), ("sat.example", 8883)
    ),
    "upstream.links[].clientId": start(linked(clientId="gw-sat"), link_mqtt(lambda m: m.client_id), "gw-sat"),
    "upstream.links[].protocol": start(linked(protocol="5"), link_mqtt(lambda m: m.protocol), MqttProtocol.V5),
    "upstream.links[].username": start(linked(username="sat-user"), link_mqtt(lambda m: m.username), "sat-user"),
    "upstream.links[].passwordEnv": start(
        linked(passwordEnv="EDGEHUB_KEYS_SAT_PASSWORD"), link_mqtt(lambda m: m.password), "from-env"
    ),
    "upstream.links[].passwordFile": start(
        linked(passwordFile="{tmp}/sat-password"), link_mqtt(lambda m: m.password), "from-file"
    ),
    "upstream.links[].sasTokenEnv": start(
        linked(sasTokenEnv="EDGEHUB_KEYS_SAT_SAS"), link_mqtt(lambda m: m.sas_token), "SharedAccessSignature sr=env"
    ),
    "upstream.links[].sasTokenFile": start(
        linked(sasTokenFile="{tmp}/sat-sas"), link_mqtt(lambda m: m.sas_token), "SharedAccessSignature sr=file"
    ),
    "upstream.links[].tls": start(linked(tls=True), link_tls("ca_certs"), (None, True)),  # the system's CAs
    "upstream.links[].caFile": start(
        linked(caFile="/etc/edgehub/sat-ca.pem"), link_tls("ca_certs"), ("/etc/edgehub/sat-ca.pem", True)
    ),
    "upstream.links[].certFile": start(
        linked(certFile="/etc/edgehub/sat.pem"), link_tls("certfile"), ("/etc/edgehub/sat.pem", True)
    ),
    "upstream.links[].keyFile": start(
        linked(certFile="/etc/edgehub/sat.pem", keyFile="/etc/edgehub/sat.key"),
        link_tls("keyfile"),
        ("/etc/edgehub/sat.key", True),
    ),
    "upstream.links[].keepaliveSecs": start(linked(keepaliveSecs=20), link_mqtt(lambda m: m.keepalive_s), 20),
    "upstream.links[].ackTimeoutSecs": start(linked(ackTimeoutSecs=7.5), link_mqtt(lambda m: m.ack_timeout_s), 7.5),
    "upstream.links[].linkRateBps": start(linked(linkRateBps=32_000), link_mqtt(lambda m: m.link_rate_bps), 32_000.0),
    "upstream.links[].linkRttMs": start(linked(linkRttMs=700), link_mqtt(lambda m: m.link_rtt_s), 0.7),
    "upstream.links[].maxUplinkBps": start(
        linked(maxUplinkBps=16_000), link_mqtt(lambda m: m.max_uplink_bps), 16_000.0
    ),
    # the cheaper link is preferred though given second
    "upstream.links[].costPerMiB": start(
        linked({"name": "cheap", "address": "127.0.0.1:1884", "costPerMiB": 0.5}, costPerMiB=8),
        lambda s: s.links and [(st.name, st.cost_per_mib) for st in s.links.links_status()],
        [("cheap", 0.5), ("sat", 8.0)],
    ),
    "upstream.links[].budget.bytes": start(
        linked(budget={"bytes": 5_000_000, "period": "day"}), link_budget("limit_bytes"), [5_000_000]
    ),
    # the list form: a month's budget and a day's, counted day first
    "upstream.links[].budget.period": start(
        linked(budget=[{"bytes": 90_000_000, "period": "month"}, {"bytes": 5_000_000, "period": "day"}]),
        link_budget("period"),
        ["day", "month"],
    ),
    "upstream.links[].budget.startHourUtc": start(
        linked(budget={"bytes": 5_000_000, "period": "day", "startHourUtc": 6}), link_budget("start_hour_utc"), [6]
    ),
    # the routed priority must be carried (else refused): the route to $upstream is given priority 1
    "upstream.links[].priorities": start(
        {**linked(priorities="0-1"), "routes": {"up": {"route": "FROM /messages/* INTO $upstream", "priority": 1}}},
        link_spec(lambda spec: sorted(spec.priorities)),
        [0, 1],
    ),
    "upstream.links[].allowedOverBudget": start(
        linked(budget={"bytes": 5_000_000, "period": "day"}, allowedOverBudget="0-1"),
        link_spec(lambda spec: sorted(spec.over_budget)),
        [0, 1],
    ),
    "upstream.links[].settleSecs": start(linked(settleSecs=30), link_spec(lambda spec: spec.settle_s), 30.0),
    **{
        f"delivery.retryPolicy.{key}": live(
            {"delivery": {"retryPolicy": {key: value}}},
            hub_retry(field),
            held,
        )
        for key, (value, field, held) in RETRY.items()
    },
    "delivery.retryPolicy.ignoreEndpointOverride": live(
        {"delivery": {"retryPolicy": {"ignoreEndpointOverride": True}}},
        lambda s: s.executor(UP).retry_policy.ignore_endpoint_override,
        True,
    ),
    "delivery.maxDeliveryAttempts": live(
        {"delivery": {"maxDeliveryAttempts": 7}}, lambda s: s.executor(UP).max_delivery_attempts, 7
    ),
    **{
        f"delivery.queuePolicy.{key}": live(
            {"delivery": {"queuePolicy": {key: value}}},
            hub_queue(field),
            held,
        )
        for key, (value, field, held) in QUEUE.items()
    },
    # A message size also sets what the heads read (the largest limit any endpoint has, as the store computes it
    # for each new connection or link): both, live.
    "delivery.queuePolicy.maxMessageSizeBytes": live(
        {"delivery": {"queuePolicy": {"maxMessageSizeBytes": 500_000}}},
        lambda s: (s.hub.store.default_policy.max_message_size_bytes, s.hub.store.largest_message_size_bytes()),
        (500_000, 500_000),
    ),
    "delivery.moduleDeliveryWindow": live(
        {"delivery": {"moduleDeliveryWindow": 64}},
        lambda s: (s.hub.modules.window, s.hub.c2d.mailboxes.window),
        (64, 64),
    ),
    **{
        f"endpoints.<endpoint>.queuePolicy.{key}": live(
            {"endpoints": {E: {"queuePolicy": {key: value}}}}, endpoint_queue(field), held
        )
        for key, (value, field, held) in QUEUE.items()
    },
    "endpoints.<endpoint>.queuePolicy.maxMessageSizeBytes": live(
        {"endpoints": {E: {"queuePolicy": {"maxMessageSizeBytes": 500_000}}}},
        lambda s: (endpoint_queue("max_message_size_bytes")(s), s.hub.store.largest_message_size_bytes()),
        (500_000, 500_000),
    ),
    **{
        f"endpoints.<endpoint>.retryPolicy.{key}": live(
            {"endpoints": {E: {"retryPolicy": {key: value}}}}, endpoint_retry(field), held
        )
        for key, (value, field, held) in RETRY.items()
    },
    "endpoints.<endpoint>.retryPolicy.ignoreEndpointOverride": Case(
        "refused",
        {"endpoints": {E: {"retryPolicy": {"ignoreEndpointOverride": True}}}},
        refused(f"endpoints.{E}.retryPolicy: ignoreEndpointOverride is the hub's"),
        True,
    ),
    "endpoints.<endpoint>.maxDeliveryAttempts": live(
        {"endpoints": {E: {"maxDeliveryAttempts": 9}}}, lambda s: s.executor(E).max_delivery_attempts, 9
    ),
    "endpoints.<endpoint>.drop": live(
        {"routes": {"m": None}, "endpoints": {E: {"drop": True}}},
        lambda s: s.reported["droppedOnUpdate"],
        [{"endpoint": E, "messages": 1}],
    ),
    "$version": live({"$version": 42}, lambda s: s.reported["lastDesiredVersion"], 42),
    "$metadata": live(
        {"$metadata": {"$lastUpdated": "2026-12-07"}},
        lambda s: s.controller.desired().get("$metadata"),
        {"$lastUpdated": "2026-12-07"},
    ),
}


def test_every_key_the_models_accept_has_a_case_and_no_case_names_another() -> None:
    keys = manifest_keys()
    leaves = {path for path, leaf in keys if leaf}
    assert leaves - set(CASES) == set(), "keys accepted with no case saying they take effect"
    assert set(CASES) - {path for path, _ in keys} == set(), "cases for keys the models do not accept"


@pytest.mark.parametrize("key", sorted(CASES))
def test_the_manifest_page_says_how_each_key_applies_as_its_case_shows(key: str) -> None:
    assert rows()[key]["live"] == CASES[key].how


def placed(value: Any, folder: Path) -> Any:
    """``value`` with "{tmp}" in its strings replaced by ``folder`` (a case's secret files are in tmp_path)."""
    if isinstance(value, str):
        return value.replace("{tmp}", str(folder))
    if isinstance(value, dict):
        return {k: placed(v, folder) for k, v in value.items()}
    if isinstance(value, list):
        return [placed(v, folder) for v in value]
    return value


def document_of(desired: dict[str, Any]) -> dict[str, Any]:
    return {"modulesContent": {"$edgeHub": {"properties.desired": desired}}}


async def check_in_process(document: Any) -> DeploymentPlan:
    return plan_of(document)


@asynccontextmanager
async def hub_started(tmp_path: Path, config: HubConfig) -> AsyncIterator[Seen]:
    """A start as ``serve`` makes it: the store opened, the deployment to run chosen by ``start_point`` (checked
    unless the store kept its plan), the upstream's settings from it, the controller started on it."""
    store = open_rocks_store(tmp_path / "store")
    lanes: list[LinkedUpstream] = []
    try:
        document = read_manifest_file(config.manifest)
        point = start_point(store, config.manifest, document)
        plan = point.plan or plan_of(point.document)
        effective = effective_settings(config, plan.settings)
        links = plan.settings.upstream.get("links")
        lanes = (  # as serve builds them (before it starts them): nothing connects
            build_linked_lanes(
                links,
                effective.transport,
                lane_ids(store, effective.upstream),
                store=store,
                data_dir=config.data_dir,
                env=ENV,
            )
            if links
            else []
        )
        async with EdgeHub(store=store, router=Router({}), host_name="hub.test") as hub:
            started_with = StartSettings(module_window=config.module_window, upstream=plan.settings.upstream)
            controller = DeploymentController(hub, started_with, check=check_in_process, env=ENV)
            assert (await controller.start(config.manifest, checked=(point.document, plan))).code == 200
            yield Seen(hub, controller, None, effective, lanes[0] if lanes else None)
    finally:
        for lane in lanes:
            await lane.close()
        await store.close()


async def apply(seen: Seen, case: Case, way: str, manifest: Path) -> Seen:
    """Set the case's key over the running deployment the way named: the file edited (the watcher's
    ``apply_file``), or a desired patch from the admin API or the cloud."""
    patch = placed(case.patch, manifest.parent)
    if way == "file":
        merged = merge_patch(copy.deepcopy(BASE), patch)
        await asyncio.to_thread(manifest.write_text, json.dumps(document_of(merged)))
        status = await seen.controller.apply_file(manifest)
    else:
        status = await seen.controller.patch_desired(patch, source=way)
    return Seen(seen.hub, seen.controller, status, seen.effective, seen.links)


@pytest.mark.parametrize("way", ["file", "admin", "cloud"])
@pytest.mark.parametrize("key", sorted(CASES))
async def test_a_key_takes_effect_whichever_way_it_came_and_still_after_a_restart(
    tmp_path: Path, key: str, way: str
) -> None:
    case = CASES[key]
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(document_of(BASE)))
    for name, secret in SECRET_FILES.items():
        (tmp_path / name).write_text(secret + "\n")  # the trailing newline is not the secret's
    config = HubConfig(manifest=manifest, data_dir=tmp_path, upstream=UPSTREAM)
    async with hub_started(tmp_path, config) as seen:
        assert case.effect(seen) != case.expected, "the base deployment has the effect already: the case shows nothing"
        # one message held for the module (not connected), for the case that drops what the endpoint holds
        await seen.hub.ingest(Identity.parse("dev1"), [Message(b"held for the module")])
        seen = await apply(seen, case, way, manifest)
        assert seen.status is not None
        needs_restart = [item.split(" ")[0] for item in seen.reported["restartRequired"]]
        if case.how == "refused":
            assert case.effect(seen) == case.expected, seen.status.errors
            assert seen.controller.reported()["runningDesiredVersion"] == 1  # nothing changed
        else:
            assert seen.status.code == 200, seen.status.errors
        if case.how == "start":
            assert needs_restart == [key.split("[]")[0]]  # a link's key is named by its list
            assert case.effect(seen) != case.expected  # not yet: the upstream runs as it started
        elif case.how != "refused":
            assert needs_restart == []
            assert case.effect(seen) == case.expected
    # The hub stops and starts again over the same store and the file as it is now.
    async with hub_started(tmp_path, config) as seen:
        assert seen.reported["restartRequired"] == []
        if case.how == "refused":
            assert case.effect(seen) is False
        elif key != "endpoints.<endpoint>.drop":  # what was dropped is reported once, by the update that dropped it
            assert case.effect(seen) == case.expected


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("passwordEnv", "EDGEHUB_KEYS_UNSET"),
        ("passwordFile", "{tmp}/no-such-secret"),
        ("sasTokenEnv", "EDGEHUB_KEYS_UNSET"),
        ("sasTokenFile", "{tmp}/no-such-secret"),
    ],
)
@pytest.mark.parametrize("way", ["file", "admin", "cloud"])
async def test_links_whose_secret_is_not_there_are_refused_rather_than_left_to_stop_the_next_start(
    tmp_path: Path, key: str, value: str, way: str
) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(document_of(BASE)))
    config = HubConfig(manifest=manifest, data_dir=tmp_path, upstream=UPSTREAM)
    async with hub_started(tmp_path, config) as seen:
        seen = await apply(seen, start(linked(**{key: value}), unsupported, None), way, manifest)
        assert seen.status is not None
        assert seen.status.code == 400
        assert [e.split(":")[0] for e in seen.status.errors] == [f"upstream.links.0.{key}"]
        assert "'sat'" in seen.status.errors[0]  # the link named
        assert (seen.reported["runningDesiredVersion"], seen.reported["restartRequired"]) == (1, [])
    if way != "file":  # the next start runs what ran (a file edited is the start's to check, and it stops it)
        async with hub_started(tmp_path, config) as seen:
            assert seen.links is None
