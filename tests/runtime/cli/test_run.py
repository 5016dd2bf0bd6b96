from __future__ import annotations

import gc
import importlib.util
import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner
from fsspec.registry import known_implementations

from edgehub.manifest.models import UpstreamConfiguration
from edgehub.runtime.cli.app import DEFAULT_MANIFEST, main
from edgehub.runtime.cli.run import show_transport
from edgehub.runtime.cli.serving import GC_THRESHOLDS, tune_gc
from edgehub.runtime.compose.config import UploadUpstreamSettings
from edgehub.upstream.mqtt.settings import MAX_PACKET_BYTES, MIN_PACKET_BYTES, MqttUpstreamSettings


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


def test_run_refuses_a_module_window_out_of_range_before_serving(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "--data-dir", str(tmp_path / "d"), "--module-window", "0"])
    assert result.exit_code == 2
    assert "0 is not in the range 1<=x<=65535" in result.output
    assert not (tmp_path / "d").exists()


def test_run_refuses_a_cleanup_interval_below_a_tenth_of_a_second(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "--data-dir", str(tmp_path / "d"), "--cleanup-interval", "0.05"])
    assert result.exit_code == 2
    assert "0.05 is not in the range x>=0.1" in result.output
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
    upstream = {
        "wireMode": "message",
        "maxUplinkBps": 16000,
        "maxBatchBytes": 3000,
        "linkRttMs": 1200,
        "maxPacketBytes": 65536,
    }
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
    assert "max packet in=65536 B out=as announced" in line  # the manifest's, over the default 1 MiB
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


def test_the_packet_limit_from_the_broker_is_set_by_the_flag_over_the_manifest(tmp_path: Path) -> None:
    manifest = write(tmp_path / "m.json", {"schemaVersion": "1.1", "routes": {}, "upstream": {"maxPacketBytes": 65536}})
    args = ["--manifest", manifest, "--upstream-mqtt", "h:1883", "--upstream-max-packet-bytes", "4096"]
    out = _run_with_port_taken(tmp_path, args)
    assert "max packet in=4096 B" in out
    # Without either, the transport's default.
    default = _run_with_port_taken(tmp_path / "2", ["--upstream-mqtt", "h:1883"])
    assert f"max packet in={MqttUpstreamSettings(host='h', client_id='c', hub_id='c').max_packet_bytes} B" in default


def test_the_brokers_packet_limit_is_set_by_the_flag_over_the_manifest(tmp_path: Path) -> None:
    upstream = {"brokerMaxPacketBytes": 262_144}
    manifest = write(tmp_path / "m.json", {"schemaVersion": "1.1", "routes": {}, "upstream": upstream})
    out = _run_with_port_taken(tmp_path, ["--manifest", manifest, "--upstream-mqtt", "h:1883"])
    assert "out=262144 B" in out
    args = ["--manifest", manifest, "--upstream-mqtt", "h:1883", "--upstream-broker-max-packet-bytes", "131072"]
    assert "out=131072 B" in _run_with_port_taken(tmp_path / "2", args)


@pytest.mark.parametrize("flag", ["--upstream-max-packet-bytes", "--upstream-broker-max-packet-bytes"])
@pytest.mark.parametrize("value", ["1023", "268435461", "1MiB"])
def test_run_refuses_a_packet_limit_mqtt_cannot_have(tmp_path: Path, flag: str, value: str) -> None:
    args = ["run", "--data-dir", str(tmp_path / "d"), "--upstream-mqtt", "h:1883", flag, value]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert flag in result.output
    assert not (tmp_path / "d").exists()


def test_the_manifest_bounds_the_packet_limit_as_the_transport_does() -> None:
    # The manifest layer does not import the transport's constants; this keeps the two in step.
    for name in ("maxPacketBytes", "brokerMaxPacketBytes"):
        field = UpstreamConfiguration.model_fields[name]
        bounds = {type(m).__name__: getattr(m, type(m).__name__.lower()) for m in field.metadata}
        assert (bounds["Ge"], bounds["Le"]) == (MIN_PACKET_BYTES, MAX_PACKET_BYTES)


def test_run_refuses_a_bad_uplink_rate_before_serving(tmp_path: Path) -> None:
    args = ["run", "--data-dir", str(tmp_path / "d"), "--upstream-mqtt", "h:1883", "--upstream-max-uplink", "fast"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "not a rate: 'fast'" in result.output
    assert not (tmp_path / "d").exists()


def _protocol_without_its_plugin() -> str:
    """An fsspec protocol fsspec knows whose plugin package is not installed here (s3 unless s3fs is)."""
    missing = [
        proto
        for proto, spec in known_implementations.items()
        if not spec["class"].startswith("fsspec.") and importlib.util.find_spec(spec["class"].split(".")[0]) is None
    ]
    assert missing, "every fsspec plugin is installed"
    return "s3" if "s3" in missing else sorted(missing)[0]


def test_run_refuses_both_upstream_transports_at_once(tmp_path: Path) -> None:
    args = ["run", "--data-dir", str(tmp_path / "d"), "--upstream-mqtt", "h:1883", "--upstream-upload", "landing"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--upstream-mqtt and --upstream-upload are two transports for $upstream: give one" in result.output
    assert not (tmp_path / "d").exists()


def test_run_refuses_an_upload_url_whose_filesystem_is_not_installed(tmp_path: Path) -> None:
    proto = _protocol_without_its_plugin()
    for url in (f"{proto}://bucket/prefix", "nosuchfs://bucket/prefix"):
        result = CliRunner().invoke(main, ["run", "--data-dir", str(tmp_path / "d"), "--upstream-upload", url])
        assert result.exit_code == 2, result.output
        assert "Invalid value for --upstream-upload" in result.output
        assert f"landing zone {url!r}: no usable filesystem" in result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "d").exists()


def test_run_refuses_mqtt_flags_next_to_an_upload_target(tmp_path: Path) -> None:
    args = ["run", "--data-dir", str(tmp_path / "d"), "--upstream-upload", str(tmp_path / "landing")]
    result = CliRunner().invoke(main, [*args, "--upstream-wire", "batch", "--upstream-linger-ms", "5"])
    assert result.exit_code == 2
    assert "--upstream-wire, --upstream-linger-ms set up the MQTT transport" in result.output
    # A password in the environment is someone else's business; only flags on the command line are refused.
    out = _run_with_port_taken(
        tmp_path, ["--upstream-upload", str(tmp_path / "landing")], env={"EDGEHUB_UPSTREAM_PASSWORD": "s3cret"}
    )
    assert f"upstream transport: upload to {tmp_path / 'landing'} hub=edgehub" in out


def test_run_refuses_a_client_id_that_cannot_name_segments(tmp_path: Path) -> None:
    args = ["run", "--data-dir", str(tmp_path / "d"), "--upstream-upload", "landing", "--upstream-client-id", "gw.1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "Invalid value for --upstream-client-id" in result.output
    assert "'gw.1' must match" in result.output


def test_run_says_which_manifest_link_keys_the_upload_transport_does_not_use(tmp_path: Path) -> None:
    upstream = {"partitions": 2, "wireMode": "message", "lingerMs": 50}
    manifest = write(tmp_path / "m.json", {"schemaVersion": "1.1", "routes": {}, "upstream": upstream})
    url = (tmp_path / "landing").as_uri()
    out = _run_with_port_taken(tmp_path, ["--manifest", manifest, "--upstream-upload", url])
    assert f"upstream transport: upload to {url} hub=edgehub" in out
    assert "upstream: manifest keys wireMode, lingerMs are the MQTT transport's; not used by upload" in out
    assert "upstream: partitions=2 duplicate detection off" in out


def test_the_upload_codec_comes_from_the_manifests_compression_and_the_flag_over_it(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "m.json", {"schemaVersion": "1.1", "routes": {}, "upstream": {"compression": "zstd", "lingerMs": 5}}
    )
    landing = str(tmp_path / "landing")
    out = _run_with_port_taken(tmp_path, ["--manifest", manifest, "--upstream-upload", landing])
    assert "(one zstd segment file per batch, {hub}/{lane}/p{NN}/{first}-{last}.jsonl.zst, a dictionary" in out
    assert "manifest keys lingerMs are the MQTT transport's; not used by upload" in out  # compression is used
    flag = ["--manifest", manifest, "--upstream-upload", landing, "--upstream-compression", "gzip"]
    out = _run_with_port_taken(tmp_path, flag)
    assert "(one gzip segment file per batch, {hub}/{lane}/p{NN}/{first}-{last}.jsonl.gz)" in out


def test_the_transport_line_leaves_the_password_of_an_upload_url_out(capsys: pytest.CaptureFixture[str]) -> None:
    show_transport(UploadUpstreamSettings(url="sftp://ops:s3cret@files.example/landing", hub_id="gw"))
    out = capsys.readouterr().out
    assert "upload to sftp://ops:***@files.example/landing hub=gw" in out
    assert "s3cret" not in out


def test_tune_gc_freezes_what_is_loaded_and_raises_the_thresholds() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 10_000  # the imported modules' objects, out of every collection
        assert gc.get_count()[0] < 1_000  # and nothing young left over from before
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
