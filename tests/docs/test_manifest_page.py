"""docs/manifest.md's "Every key" table against the code: the keys the pydantic models accept, the defaults of the
models and of the policies that fill what a deployment leaves out, and what a change needs a restart for."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from edgehub.delivery.retry import RetryPolicy
from edgehub.manifest import EdgeHubDesired, load_desired
from edgehub.runtime.deployment.settings import StartSettings, settings_of
from edgehub.runtime.deployment.wants import QUEUE_KEYS, RETRY_KEYS, desired_settings
from edgehub.store import QueuePolicy
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from tests.docs.manifest_keys import manifest_keys
from tests.docs.pages import DOCS, table_rows

PAGE = DOCS / "manifest.md"
LIVE_WORDS = {"live", "start", "accepted", "refused"}  # no key is accepted and left unapplied


def rows() -> dict[str, dict[str, str]]:
    """The table's rows by key: ``default``, ``values``, ``live``, ``what``."""
    out: dict[str, dict[str, str]] = {}
    for cells in table_rows(PAGE, "## Every key"):
        key, default, values, live, what = cells
        assert key[:1] == key[-1:] == "`", f"not a key in code: {key}"
        assert key[1:-1] not in out, f"{key} is listed twice"
        out[key[1:-1]] = {"default": default, "values": values, "live": live, "what": what}
    return out


def first_code(cell: str) -> Any:
    """The JSON value in the cell's first code span (``7200``, ``gzip`` as a string, ``false``)."""
    assert "`" in cell, f"no value in code in {cell!r}"
    text = cell.split("`")[1]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def assert_default(cell: str, value: Any, key: str) -> None:
    if value is None:
        assert cell.startswith("none"), f"{key}: the default is none, the page says {cell!r}"
    else:
        assert first_code(cell) == plain(value), f"{key}: the default is {plain(value)!r}, the page says {cell!r}"


def test_the_manifest_page_lists_every_key_the_models_accept_and_no_other() -> None:
    listed = set(rows())
    keys = manifest_keys()
    leaves = {path for path, leaf in keys if leaf}
    known = {path for path, _ in keys}
    assert leaves - listed == set(), "keys the models accept that the page does not list"
    assert listed - known == set(), "keys on the page the models do not accept"


def test_every_key_on_the_manifest_page_says_whether_it_applies_live() -> None:
    for key, row in rows().items():
        assert row["live"] in LIVE_WORDS, f"{key}: {row['live']!r}"


def model_defaults(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """The scalar defaults the models give (not None, not a factory), by key path."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        if field.default is not PydanticUndefined and field.default is not None:
            out[path] = field.default
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.update(model_defaults(annotation, f"{path}."))
    return out


def test_the_manifest_page_gives_the_defaults_the_models_set() -> None:
    listed = rows()
    defaults = model_defaults(EdgeHubDesired)
    assert defaults, "the models set no scalar default: the walk is broken"
    for key, value in defaults.items():
        assert_default(listed[key]["default"], value, key)


@pytest.mark.parametrize("section", ["delivery.queuePolicy", "delivery.retryPolicy"])
def test_the_manifest_page_gives_the_policy_defaults_a_deployment_falls_back_to(section: str) -> None:
    # A key the deployment leaves out is None in the models; the runtime fills it from QueuePolicy / RetryPolicy.
    names, policy = (QUEUE_KEYS, QueuePolicy()) if section.endswith("queuePolicy") else (RETRY_KEYS, RetryPolicy())
    listed = rows()
    for key, field in names.items():
        assert_default(listed[f"{section}.{key}"]["default"], getattr(policy, field), f"{section}.{key}")


def test_the_manifest_page_gives_the_link_defaults_the_mqtt_upstream_runs_with() -> None:
    s = MqttUpstreamSettings(host="broker", client_id="gw", hub_id="gw")
    expected = {
        "upstream.wireMode": s.wire_mode,
        "upstream.lingerMs": round(s.linger_s * 1000),
        "upstream.linkRateBps": round(s.link_rate_bps),
        "upstream.linkRttMs": round(s.link_rtt_s * 1000),
        "upstream.compression": s.compression,
        "upstream.maxPacketBytes": s.max_packet_bytes,
        "upstream.maxUplinkBps": s.max_uplink_bps,
        "upstream.brokerMaxPacketBytes": s.broker_max_packet_bytes,
    }
    listed = rows()
    for key, value in expected.items():
        assert_default(listed[key]["default"], value, key)


def test_the_keys_a_restart_is_reported_for_are_not_called_live_on_the_manifest_page() -> None:
    upstream = {
        "partitions": 2,
        "duplicateDetection": True,
        "duplicateDetectionWindowSecs": 60,
        "wireMode": "message",
        "maxUplinkBps": 32000,
        "maxBatchBytes": 4096,
        "lingerMs": 50,
        "maxInflightBytes": 8192,
        "linkRateBps": 128000,
        "linkRttMs": 300,
        "compression": "zstd",
        "maxPacketBytes": 2048,
        "brokerMaxPacketBytes": 4096,
        "links": [{"name": "cell", "address": "cell.example:8883"}],
    }
    desired = {"schemaVersion": "1.1", "upstream": upstream, "delivery": {"moduleDeliveryWindow": 4}}
    started_with = {k: None for k in upstream} | {"partitions": 1}
    wanted = desired_settings(load_desired(desired))
    running = settings_of(wanted, StartSettings(module_window=16, upstream=started_with))
    needs_restart = {item.split(" ")[0] for item in running.restart_required}
    assert {f"upstream.{k}" for k in upstream} == needs_restart
    assert running.module_window == 4  # live: the window the hub's mailboxes hold each link to
    listed = rows()
    for key in needs_restart:
        if key == "upstream.links":  # a list of links: its rows are upstream.links[].<key>
            assert all(r["live"] == "start" for k, r in listed.items() if k.startswith("upstream.links[]"))
            continue
        assert listed[key]["live"] != "live", f"{key} takes a restart (restartRequired), the page says live"
    for key, row in listed.items():
        if row["live"] == "start":
            whole = key.split("[]")[0]  # upstream.links[].name: a change of the list is reported as upstream.links
            assert whole in needs_restart, f"{key}: the page says it takes a restart, the hub applies it live"
