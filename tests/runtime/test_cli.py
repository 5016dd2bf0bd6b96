from __future__ import annotations

import json
import socket
from pathlib import Path

from click.testing import CliRunner

from edgehub.runtime.cli import DEFAULT_MANIFEST, main


def write(path: Path, doc: object) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def test_routes_check_accepts_the_default_manifest() -> None:
    result = CliRunner().invoke(main, ["routes", "check", str(DEFAULT_MANIFEST)])
    assert result.exit_code == 0, result.output
    assert "ok: 2 routes" in result.output
    assert "alerts: priority=0 ttl=86400s endpoint=$upstream" in result.output


def test_routes_check_prints_every_error_with_a_caret_and_exits_1(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "m.json",
        {
            "schemaVersion": "1.1",
            "routes": {
                "a": "FROM /* WHERE temp > 5 INTO $upstream",
                "b": {"route": "FROM /x INTO $nope", "priority": 1},
            },
        },
    )
    result = CliRunner().invoke(main, ["routes", "check", manifest])
    assert result.exit_code == 1
    assert "route 'a', line 1, column 20: operator '>'" in result.output
    assert "route 'b', line 1, column 14: unknown sink '$nope'" in result.output
    assert "\n                 ^^^^^" in result.output


def test_routes_check_refuses_a_bad_manifest(tmp_path: Path) -> None:
    manifest = write(tmp_path / "m.json", {"schemaVersion": "2.0", "routes": {}})
    result = CliRunner().invoke(main, ["routes", "check", manifest])
    assert result.exit_code == 1
    assert "schemaVersion '2.0' is not supported" in result.output


def test_routes_test_shows_each_verdict_and_the_result(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "m.json",
        {
            "modulesContent": {
                "$edgeHub": {
                    "properties.desired": {
                        "schemaVersion": "1.1",
                        "routes": {
                            "hot": {"route": "FROM /messages/* WHERE $body.t > 20 INTO $upstream", "priority": 1},
                            "mods": "FROM /messages/modules/* INTO $upstream",
                            "never": "FROM /* WHERE missing = 'x' INTO BrokeredEndpoint('/modules/m/inputs/i')",
                        },
                        "storeAndForwardConfiguration": {"timeToLiveSecs": 300},
                    }
                }
            }
        },
    )
    message = write(
        tmp_path / "msg.json",
        {
            "body": {"t": 21},
            "properties": {"a": "1"},
            "systemProperties": {
                "connectionDeviceId": "d1",
                "contentType": "application/json",
                "contentEncoding": "utf-8",
            },
        },
    )
    result = CliRunner().invoke(main, ["routes", "test", manifest, message])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "message source: /messages" in lines
    assert "hot: TRUE  (condition is TRUE)" in lines
    assert "mods: -  (source '/messages' is not under '/messages/modules/*')" in lines
    assert "never: UNDEFINED  (condition is UNDEFINED)" in lines
    assert "result: endpoint=$upstream priority=1 ttl_s=300 (global)" in lines


def test_run_refuses_a_bad_manifest_before_serving(tmp_path: Path) -> None:
    # The start-up output of a real run (version, routes, certificates, ports) is tested on the process itself
    # in tests/e2e/test_run_process.py.
    manifest = write(tmp_path / "m.json", {"schemaVersion": "2.0", "routes": {}})
    result = CliRunner().invoke(main, ["run", "--manifest", manifest, "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 1
    assert "schemaVersion '2.0' is not supported" in result.output
    assert not (tmp_path / "d").exists()


def test_run_says_in_one_line_that_its_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = CliRunner().invoke(main, ["run", "--data-dir", str(tmp_path / "d"), "--mqtts-port", port])
    assert result.exit_code == 1
    [line] = [x for x in result.output.splitlines() if x.startswith("edgehub:")]
    assert f"('127.0.0.1', {port}): address already in use" in line
    assert "Traceback" not in result.output


def test_run_refuses_a_partition_count_out_of_range_before_serving(tmp_path: Path) -> None:
    args = ["run", "--manifest", str(DEFAULT_MANIFEST), "--data-dir", str(tmp_path / "d"), "--upstream-partitions"]
    result = CliRunner().invoke(main, [*args, "65"])
    assert result.exit_code == 2
    assert "65 is not in the range 1<=x<=64" in result.output
    assert not (tmp_path / "d").exists()


def test_run_refuses_a_manifest_with_a_bad_upstream_section(tmp_path: Path) -> None:
    manifest = write(tmp_path / "m.json", {"schemaVersion": "1.1", "routes": {}, "upstream": {"partitions": 0}})
    result = CliRunner().invoke(main, ["run", "--manifest", manifest, "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 1
    assert "upstream.partitions: Input should be greater than or equal to 1" in result.output


def _run_with_port_taken(tmp_path: Path, args: list[str], env: dict[str, str] | None = None) -> str:
    """``edgehub run`` up to the point where it would serve (its TLS port is taken): its start-up output."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = CliRunner().invoke(
            main, ["run", "--data-dir", str(tmp_path / "d"), "--mqtts-port", port, *args], env=env
        )
    assert result.exit_code == 1, result.output
    return result.output


def test_run_applies_the_manifests_link_settings_and_the_flags_over_them(tmp_path: Path) -> None:
    upstream = {"wireMode": "message", "maxUplinkBps": 16000, "maxBatchBytes": 3000, "linkRttMs": 1200}
    manifest = write(tmp_path / "m.json", {"schemaVersion": "1.1", "routes": {}, "upstream": upstream})
    out = _run_with_port_taken(
        tmp_path,
        [
            *["--manifest", manifest, "--upstream-mqtt", "cloud.example:8883", "--upstream-max-uplink", "32kbit"],
            *["--upstream-compression", "zstd"],
        ],
        env={"EDGEHUB_UPSTREAM_PASSWORD": "s3cret"},
    )
    [line] = [x for x in out.splitlines() if x.startswith("upstream transport:")]
    assert "mqtt 3.1.1 cloud.example:8883 tls=off auth=password wire=message codec=zstd batch=3000 B" in line
    assert "window=12600 B" in line  # 64 kbit/s x 1.2 s (the manifest's RTT) + one batch
    assert "max uplink=32000 bit/s" in line  # the flag over the manifest's 16000
    assert "s3cret" not in out


def test_run_takes_tls_and_a_client_certificate_for_the_upstream(tmp_path: Path) -> None:
    ca, cert = tmp_path / "ca.pem", tmp_path / "c.pem"
    ca.write_text("-")
    cert.write_text("-")
    out = _run_with_port_taken(
        tmp_path,
        ["--upstream-mqtt", "h:8883", "--upstream-ca-file", str(ca), "--upstream-cert-file", str(cert)],
    )
    assert "tls=on auth=none + client certificate" in out


def test_run_refuses_a_bad_uplink_rate_before_serving(tmp_path: Path) -> None:
    args = ["run", "--data-dir", str(tmp_path / "d"), "--upstream-mqtt", "h:1883", "--upstream-max-uplink", "fast"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "not a rate: 'fast'" in result.output
    assert not (tmp_path / "d").exists()
