"""maxUplinkBps reaches the upload transport as it reaches MQTT's: from the manifest, the command line over it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgehub.manifest import load_desired_file
from edgehub.runtime.cli.app import main
from edgehub.runtime.cli.run import show_transport
from edgehub.runtime.compose.config import HubConfig, UploadUpstreamSettings, UpstreamOverrides
from edgehub.runtime.compose.upstream import transport_settings, upload_lane


def _manifest(tmp_path: Path, upstream: dict[str, object]) -> Path:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"schemaVersion": "1.1", "routes": {}, "upstream": upstream}))
    return path


def test_the_manifests_max_uplink_bps_caps_the_upload_lanes_and_the_command_line_wins(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, {"maxUplinkBps": 32_000})
    desired = load_desired_file(manifest)
    base = UploadUpstreamSettings(url=str(tmp_path / "landing"), hub_id="hub1")
    config = HubConfig(manifest=manifest, data_dir=tmp_path / "data", upstream=base)
    settings = transport_settings(desired.upstream.model_dump(), config)
    assert isinstance(settings, UploadUpstreamSettings)
    assert settings.max_uplink_bps == 32_000
    assert upload_lane(settings, "$upstream").max_uplink_bps == 32_000
    cli = HubConfig(
        manifest=manifest,
        data_dir=tmp_path / "data",
        upstream=base,
        upstream_overrides=UpstreamOverrides(max_uplink_bps=16_000),
    )
    overridden = transport_settings(desired.upstream.model_dump(), cli)
    assert isinstance(overridden, UploadUpstreamSettings)
    assert upload_lane(overridden, "$upstream").max_uplink_bps == 16_000
    uncapped = transport_settings(
        load_desired_file(_manifest(tmp_path, {})).upstream.model_dump(),
        HubConfig(manifest=manifest, data_dir=tmp_path / "data", upstream=base),
    )
    assert isinstance(uncapped, UploadUpstreamSettings)
    assert upload_lane(uncapped, "$upstream").max_uplink_bps is None


def test_the_upload_transport_line_shows_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    show_transport(UploadUpstreamSettings(url="/data/landing", hub_id="gw", max_uplink_bps=32_000))
    assert "upload to /data/landing hub=gw" in capsys.readouterr().out
    show_transport(UploadUpstreamSettings(url="/data/landing", hub_id="gw", max_uplink_bps=32_000))
    assert capsys.readouterr().out.rstrip().endswith("uplink cap 32000 bit/s")


def test_the_uplink_cap_flag_is_not_refused_next_to_an_upload_target(tmp_path: Path) -> None:
    args = ["run", "--data-dir", str(tmp_path / "d"), "--upstream-upload", str(tmp_path / "landing")]
    result = CliRunner().invoke(main, [*args, "--upstream-max-uplink", "32kbit", "--upstream-linger-ms", "5"])
    assert result.exit_code == 2
    assert "--upstream-linger-ms set up the MQTT transport" in result.output  # only that one
