"""The first run's pieces without a hub: ``edgehub sas-token``, the connect help, and where ``$upstream`` goes
when no upstream flag is given."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from click.testing import CliRunner

from edgehub.core import SystemClock
from edgehub.core.sas import ConnectionString, verify_sas_token
from edgehub.runtime.cli.app import DEFAULT_MANIFEST, main
from edgehub.runtime.cli.firstrun import connect_help, edgehub_command

CS = "HostName=localhost;DeviceId=dev1;SharedAccessKey=cG9FbHdUZVR5SzV2czV3djg2SlFvUDhpMy9Gak1sQjU=;GatewayHostName=h"


def test_sas_token_signs_a_token_the_hub_accepts_for_the_connection_strings_device() -> None:
    result = CliRunner().invoke(main, ["sas-token", "--expires-in", "2h"], input=CS + "\n")
    assert result.exit_code == 0, result.output
    cs = ConnectionString.parse(CS)
    assert cs.shared_access_key is not None
    parsed = verify_sas_token(
        result.output.strip(), resource=cs.resource(), key_b64=cs.shared_access_key, clock=SystemClock()
    )
    assert 7100 < parsed.expiry_s - time.time() <= 7200


def test_sas_token_refuses_a_bad_connection_string_or_lifetime_without_a_traceback() -> None:
    for args, text, hint in (
        (["sas-token", "HostName=x;Nope=1"], None, "CONNECTION_STRING"),
        (["sas-token", "--expires-in", "soon"], CS, "--expires-in"),
        (["sas-token", "--expires-in", "9000h"], CS, "--expires-in"),
        (["sas-token", "HostName=localhost;DeviceId=dev1"], None, "no SharedAccessKey"),
    ):
        result = CliRunner().invoke(main, args, input=text)
        assert result.exit_code == 2, result.output
        assert hint in result.output
        assert "Traceback" not in result.output


def test_connect_help_over_plain_mqtt_has_no_ca_file_and_names_the_port() -> None:
    lines = connect_help(
        ports={"tcp": 1883},
        data_dir=Path("data"),
        ca_pem=Path("data/certs/ca.pem"),
        host_name="gw.local",
        upstream="stays queued",
    )
    text = "\n".join(lines)
    assert "--cafile" not in text
    assert "tls_set" not in text
    assert "-h gw.local -p 1883" in text
    assert "'gw.local/dev1/?api-version=2021-04-12'" in text
    assert connect_help(ports={}, data_dir=Path("d"), ca_pem=Path("c"), host_name="h", upstream="u") == []


def test_the_embedded_default_manifest_is_the_example_in_deployment() -> None:
    example = Path(__file__).resolve().parents[3] / "deployment" / "examples" / "default.json"
    assert DEFAULT_MANIFEST.parent.name == "runtime"  # in the package, so an installed edgehub has it
    assert json.loads(DEFAULT_MANIFEST.read_text()) == json.loads(example.read_text())


def test_printed_commands_run_the_edgehub_that_was_started() -> None:
    assert edgehub_command(".venv/bin/edgehub") == ".venv/bin/edgehub"
    assert edgehub_command("/usr/lib/python3/pytest") == "edgehub"


def _start_output(tmp_path: Path, *args: str) -> str:
    """``edgehub run`` up to the point where it would serve (its TLS port is taken): its start-up output."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = CliRunner().invoke(main, ["run", "--data-dir", str(tmp_path / "d"), "--mqtts-port", port, *args])
    assert result.exit_code == 1, result.output
    return result.output


def test_run_uploads_upstream_to_the_data_dirs_landing_folder_unless_told_otherwise(tmp_path: Path) -> None:
    out = _start_output(tmp_path)
    assert f"upstream transport: upload to {tmp_path / 'd' / 'landing'} hub=edgehub" in out
    assert "not used by upload" not in out  # the default manifest sets no MQTT-only link keys
    out = _start_output(tmp_path, "--no-upstream")
    assert "upstream transport: none ($upstream stays queued)" in out


def test_run_refuses_no_upstream_beside_a_transport_and_mqtt_flags_without_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["run", "--data-dir", str(tmp_path / "d"), "--no-upstream", "--upstream-mqtt", "h:1"]
    )
    assert result.exit_code == 2
    assert "--no-upstream keeps $upstream queued" in result.output
    result = CliRunner().invoke(main, ["run", "--data-dir", str(tmp_path / "d"), "--upstream-wire", "message"])
    assert result.exit_code == 2
    assert "--upstream-wire set up the MQTT transport" in result.output
    assert "(the default without --upstream-mqtt)" in result.output
    assert not (tmp_path / "d").exists()
