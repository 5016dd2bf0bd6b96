from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgehub.manifest import DEFAULT_TTL_SECS, ManifestError, load_desired, load_desired_file
from edgehub.routing import RouteSpec


def desired(**kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"schemaVersion": "1.1", "routes": {"r": "FROM /* INTO $upstream"}}
    doc.update(kw)
    return doc


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.1.0", "1.2", "1.3", "1.3.0"])
def test_schema_versions_with_major_1_and_minor_0_to_3_are_accepted(version: str) -> None:
    assert load_desired(desired(schemaVersion=version)).schemaVersion == version


@pytest.mark.parametrize("version", ["1", "2.0", "1.4", "1.1.1", "", "v1.1"])
def test_other_schema_versions_are_refused(version: str) -> None:
    with pytest.raises(ManifestError, match="schemaVersion"):
        load_desired(desired(schemaVersion=version))


def test_route_objects_carry_priority_and_ttl() -> None:
    d = load_desired(
        desired(
            routes={
                "plain": "FROM /* INTO $upstream",
                "obj": {"route": "FROM /messages INTO $upstream", "priority": 2, "timeToLiveSecs": 30},
            },
            storeAndForwardConfiguration={"timeToLiveSecs": 99},
        )
    )
    assert d.route_specs() == {
        "plain": RouteSpec(route="FROM /* INTO $upstream"),
        "obj": RouteSpec(route="FROM /messages INTO $upstream", priority=2, time_to_live_secs=30),
    }
    assert d.time_to_live_secs == 99


def test_global_ttl_defaults_as_azure_iot_edge() -> None:
    assert load_desired(desired()).time_to_live_secs == DEFAULT_TTL_SECS


@pytest.mark.parametrize(
    ("routes", "fragment"),
    [
        ({"a.b": "FROM /* INTO $upstream"}, "route name 'a.b'"),
        ({"$a": "FROM /* INTO $upstream"}, "route name '$a'"),
        ({"a b": "FROM /* INTO $upstream"}, "route name 'a b'"),
        ({"a#": "FROM /* INTO $upstream"}, "route name 'a#'"),
        ({"r": {"route": "FROM /* INTO $upstream", "priority": 10}}, "priority"),
        ({"r": {"route": "FROM /* INTO $upstream", "timeToLiveSecs": -1}}, "timeToLiveSecs"),
        ({"r": {"route": "FROM /* INTO $upstream", "extra": 1}}, "extra"),
    ],
)
def test_bad_routes_sections_are_refused_naming_the_field(routes: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ManifestError, match=fragment.replace("$", r"\$")):
        load_desired(desired(routes=routes))


def test_route_objects_need_schema_1_1() -> None:
    with pytest.raises(ManifestError, match=r"need schemaVersion 1\.1"):
        load_desired(desired(schemaVersion="1.0", routes={"r": {"route": "FROM /* INTO $upstream"}}))


def test_full_deployment_manifest_or_desired_properties_alone() -> None:
    full = {"modulesContent": {"$edgeHub": {"properties.desired": desired()}}}
    assert load_desired(full).routes == load_desired(desired()).routes
    with pytest.raises(ManifestError, match=r"no modulesContent.\$edgeHub"):
        load_desired({"modulesContent": {}})


def test_files_that_are_not_json_say_where(tmp_path: Path) -> None:
    p = tmp_path / "m.json"
    p.write_text('{"schemaVersion": "1.1",\n  "routes": }')
    with pytest.raises(ManifestError, match="line 2"):
        load_desired_file(p)
    with pytest.raises(ManifestError, match="cannot read"):
        load_desired_file(tmp_path / "missing.json")


def test_upstream_defaults_to_one_partition_without_duplicate_detection() -> None:
    up = load_desired(desired()).upstream
    assert (up.partitions, up.duplicateDetection, up.duplicateDetectionWindowSecs) == (1, False, 600)


def test_upstream_section_sets_partitions_and_duplicate_detection() -> None:
    up = load_desired(
        desired(upstream={"partitions": 4, "duplicateDetection": True, "duplicateDetectionWindowSecs": 120})
    ).upstream
    assert (up.partitions, up.duplicateDetection, up.duplicateDetectionWindowSecs) == (4, True, 120)


def test_upstream_link_settings_are_unset_unless_given() -> None:
    up = load_desired(desired()).upstream
    assert (up.wireMode, up.maxUplinkBps, up.maxBatchBytes, up.lingerMs) == (None, None, None, None)
    assert (up.maxInflightBytes, up.linkRateBps, up.linkRttMs) == (None, None, None)
    given = {"wireMode": "message", "maxUplinkBps": 32000, "lingerMs": 0, "linkRttMs": 1200}
    up = load_desired(desired(upstream=given)).upstream
    assert (up.wireMode, up.maxUplinkBps, up.lingerMs, up.linkRttMs) == ("message", 32000, 0, 1200)


@pytest.mark.parametrize(
    ("upstream", "fragment"),
    [
        ({"partitions": 0}, r"upstream\.partitions: Input should be greater than or equal to 1"),
        ({"partitions": 65}, r"upstream\.partitions: Input should be less than or equal to 64"),
        ({"partitions": "4"}, r"upstream\.partitions: Input should be a valid integer"),
        ({"partitions": 2.5}, r"upstream\.partitions: Input should be a valid integer"),
        ({"duplicateDetection": "yes"}, r"upstream\.duplicateDetection: Input should be a valid boolean"),
        ({"duplicateDetectionWindowSecs": 0}, r"upstream\.duplicateDetectionWindowSecs: .* greater than or equal"),
        ({"duplicateDetectionWindowSecs": 604_801}, r"upstream\.duplicateDetectionWindowSecs: .* less than or equal"),
        ({"duplicateDetections": True}, r"upstream\.duplicateDetections: unknown key"),
        ({"wireMode": "fast"}, r"upstream\.wireMode: Input should be 'batch' or 'message'"),
        ({"compression": "lz4"}, r"upstream\.compression: Input should be 'gzip' or 'zstd'"),
        ({"maxUplinkBps": 999}, r"upstream\.maxUplinkBps: Input should be greater than or equal to 1000"),
        ({"maxUplinkBps": "64kbit"}, r"upstream\.maxUplinkBps: Input should be a valid integer"),
        ({"lingerMs": -1}, r"upstream\.lingerMs: Input should be greater than or equal to 0"),
        ({"maxBatchBytes": 100}, r"upstream\.maxBatchBytes: Input should be greater than or equal to 256"),
        ({"maxPacketBytes": 1023}, r"upstream\.maxPacketBytes: Input should be greater than or equal to 1024"),
        ({"maxPacketBytes": 268_435_461}, r"upstream\.maxPacketBytes: Input should be less than or equal to"),
        ({"brokerMaxPacketBytes": 512}, r"upstream\.brokerMaxPacketBytes: Input should be greater than or equal to"),
        ({"brokerMaxPacketBytes": "65536"}, r"upstream\.brokerMaxPacketBytes: Input should be a valid integer"),
        ("4", r"upstream: Input should be a valid dictionary"),
    ],
)
def test_bad_upstream_settings_are_refused_naming_the_field(upstream: object, fragment: str) -> None:
    with pytest.raises(ManifestError, match=fragment):
        load_desired(desired(upstream=upstream))
