"""``edgehub config show`` through the real command line: every setting with its source, from the same functions
``edgehub run`` serves with (``run_config``, ``effective_settings``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgehub.runtime.cli.app import main
from edgehub.runtime.cli.run import SETTING_OF, RunConfig, run_option_groups
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.settings import effective_settings
from edgehub.runtime.deployment.wants import DesiredSettings
from edgehub.runtime.logs import LogFormat
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings

pytestmark = pytest.mark.timeout(60)


def shown(output: str) -> dict[str, tuple[str, str]]:
    """``config show``'s lines as name -> (value, source)."""
    rows: dict[str, tuple[str, str]] = {}
    for line in output.splitlines():
        name, rest = line.split(maxsplit=1)
        value, source = rest.rsplit(maxsplit=1)
        rows[name] = (value.strip(), source)
    return rows


ROUTES = {"schemaVersion": "1.1", "routes": {"all": "FROM /messages/* INTO $upstream"}}


def config_show(tmp_path: Path, *flags: str, manifest: dict[str, object], admin_port: str | None = None) -> str:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(ROUTES | manifest))
    args = ["config", "show", "--manifest", str(path), "--data-dir", str(tmp_path / "data"), *flags]
    # The test session sets the admin and WebSocket ports' environment variables (tests/conftest.py); None takes
    # them out.
    result = CliRunner().invoke(main, args, env={"EDGEHUB_ADMIN_PORT": admin_port, "EDGEHUB_WSS_PORT": None})
    assert result.exit_code == 0, result.output
    return result.output


def test_config_show_names_flag_profile_manifest_and_default_as_the_source_of_each_setting(tmp_path: Path) -> None:
    profile = tmp_path / "board.toml"
    profile.write_text('[store]\nfsync = "none"\n')
    rows = shown(
        config_show(
            tmp_path, "--profile", str(profile), "--mqtt-port", "1883", manifest={"upstream": {"partitions": 2}}
        )
    )

    assert rows["mqtt_port"] == ("1883", "flag")
    assert rows["store.fsync"] == ("none", "profile")
    assert rows["upstream.partitions"] == ("2", "manifest")
    assert rows["deployment"] == ("file", "manifest")  # nothing kept yet: the file's
    given = {"mqtt_port", "store.fsync", "upstream.partitions", "manifest", "data_dir", "profile", "deployment"}
    assert {name: source for name, (_, source) in rows.items() if name not in given} == {
        name: "default" for name in rows if name not in given
    }
    assert rows["mqtts_port"] == ("8883", "default")
    assert rows["upstream.transport"] == (f"upload {tmp_path / 'data' / 'landing'}", "default")


def test_a_flag_over_the_manifest_over_the_profile_for_the_upstream_and_the_manifest_over_the_flag_for_fsync(
    tmp_path: Path,
) -> None:
    # The deployment's store settings are applied over the command line's at every deployment (settings.py).
    rows = shown(
        config_show(
            tmp_path,
            "--upstream-partitions",
            "3",
            "--fsync",
            "always",
            manifest={"upstream": {"partitions": 2}, "storeAndForwardConfiguration": {"fsync": "interval"}},
        )
    )

    assert rows["upstream.partitions"] == ("3", "flag")
    assert rows["store.fsync"] == ("interval", "manifest")


def test_a_flag_given_in_its_environment_variable_is_a_flag(tmp_path: Path) -> None:
    rows = shown(config_show(tmp_path, manifest={}, admin_port="9700"))

    assert rows["admin_port"] == ("9700", "flag")


def test_config_show_refuses_a_bad_manifest_as_run_does_and_leaves_no_data_directory(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"r": "FROM /messages/* INTO"}}))

    result = CliRunner().invoke(main, ["config", "show", "--manifest", str(path), "--data-dir", str(tmp_path / "d")])

    assert result.exit_code == 1
    assert result.output.splitlines()[0] == f"{path}: refused"
    assert not (tmp_path / "d").exists()


def test_run_and_config_show_take_the_same_flags_in_the_same_groups() -> None:
    run_help = CliRunner().invoke(main, ["run", "--help"]).output
    show_help = CliRunner().invoke(main, ["config", "show", "--help"]).output

    sections = [line for line in run_help.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert {"Listeners:", "Upstream transport:", "Logging:"} <= set(sections)
    assert [line for line in show_help.splitlines() if line in sections] == sections


def test_every_flag_of_run_names_a_setting_that_config_show_prints() -> None:
    # A flag missing here would be shown as "default" even when given.
    flags = {option.name for group in run_option_groups() for option in group.options}
    assert flags == set(SETTING_OF)
    mqtt = MqttUpstreamSettings(host="broker", port=1883, client_id="gw", hub_id="gw")
    config = HubConfig(manifest=Path("m.json"), data_dir=Path("data"), upstream=mqtt)
    started = RunConfig(hub=config, log_level="info", log_format=LogFormat.TEXT)
    section = {"partitions": 1, "duplicateDetection": False, "duplicateDetectionWindowSecs": 600}
    wanted = DesiredSettings(default_ttl_s=7200.0, upstream=section)
    table = effective_settings(config, wanted).table + started.log_settings()
    assert {name for names in SETTING_OF.values() for name in names} <= {row.name for row in table}


def test_an_upstream_websocket_url_and_proxy_are_shown_without_the_proxy_credentials(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(ROUTES))
    secret = tmp_path / "proxy.credentials"
    secret.write_text("edge:s3cret\n")
    args = ["config", "show", "--manifest", str(path), "--data-dir", str(tmp_path / "data")]
    args += ["--upstream-mqtt", "wss://broker.example/$iothub/websocket", "--upstream-proxy", "10.0.0.1:3128"]
    args += ["--upstream-proxy-credentials-file", str(secret)]
    result = CliRunner().invoke(main, args, env={"EDGEHUB_WSS_PORT": None})
    assert result.exit_code == 0, result.output
    rows = shown(result.output)
    assert rows["upstream.transport"] == ("mqtt broker.example:443/$iothub/websocket (WebSocket)", "flag")
    assert rows["upstream.tls"] == ("on", "default")  # wss: TLS, as the URL says
    assert rows["upstream.proxy"] == ("10.0.0.1:3128", "flag")
    assert "s3cret" not in result.output
    assert rows["wss_port"] == ("443 where the hub may bind it, else off", "default")


def test_a_proxy_credential_without_a_colon_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(ROUTES))
    args = ["config", "show", "--manifest", str(path), "--data-dir", str(tmp_path / "data")]
    args += ["--upstream-mqtt", "ws://broker.example:8080/mqtt", "--upstream-proxy", "proxy:3128"]
    env = {"EDGEHUB_WSS_PORT": None, "EDGEHUB_UPSTREAM_PROXY_CREDENTIALS": "no-colon"}
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 2
    assert "USER:PASSWORD" in result.output


def s3_environment(tmp_path: Path, **variables: str) -> dict[str, str | None]:
    """The standard AWS variables ``variables`` alone (the machine's others taken out, its ``~/.aws`` files
    replaced by the test's own, and no instance metadata lookup)."""
    aws = tmp_path / "aws"
    aws.mkdir(exist_ok=True)
    for name in ("config", "credentials"):
        (aws / name).touch()
    cleared: dict[str, str | None] = {
        name: None
        for name in (
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT_URL_S3",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_CA_BUNDLE",
        )
    }
    return {
        **cleared,
        "AWS_CONFIG_FILE": str(aws / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(aws / "credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "EDGEHUB_ADMIN_PORT": None,
        "EDGEHUB_WSS_PORT": None,
        **variables,
    }


def s3_rows(tmp_path: Path, env: dict[str, str | None]) -> tuple[dict[str, tuple[str, str]], str]:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(ROUTES))
    args = ["config", "show", "--manifest", str(path), "--data-dir", str(tmp_path / "data")]
    result = CliRunner().invoke(main, [*args, "--upstream-upload", "s3://lake/landing"], env=env)
    assert result.exit_code == 0, result.output
    rows = {n: v for n, v in shown(result.output).items() if n.startswith("upstream.s3")}
    return rows, result.output


def test_config_show_says_where_an_s3_landing_zone_writes_and_who_signs_from_the_environment_without_a_secret(
    tmp_path: Path,
) -> None:
    env = s3_environment(
        tmp_path,
        AWS_ENDPOINT_URL_S3="https://minio.example:9000",
        AWS_ACCESS_KEY_ID="AKIAEDGEHUBTEST7Q2Z",
        AWS_SECRET_ACCESS_KEY="the-secret-key-never-shown",
        AWS_DEFAULT_REGION="eu-west-1",
        AWS_CA_BUNDLE="/etc/edgehub/minio-ca.pem",
    )
    rows, output = s3_rows(tmp_path, env)
    assert rows == {
        "upstream.s3.endpoint": ("https://minio.example:9000 (AWS_ENDPOINT_URL_S3)", "environment"),
        "upstream.s3.region": ("eu-west-1 (AWS_DEFAULT_REGION)", "environment"),
        "upstream.s3.credentials": (
            "access key ...7Q2Z (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
            "environment",
        ),
        "upstream.s3.trusts": ("/etc/edgehub/minio-ca.pem (AWS_CA_BUNDLE)", "environment"),
    }
    assert "the-secret-key-never-shown" not in output
    assert "AKIAEDGEHUBTEST7Q2Z" not in output


def test_config_show_reads_an_s3_endpoint_and_credentials_from_a_named_profile_and_says_when_there_are_none(
    tmp_path: Path,
) -> None:
    env = s3_environment(tmp_path, AWS_PROFILE="edge")
    (tmp_path / "aws" / "config").write_text(
        "[profile edge]\nendpoint_url = http://ceph.example:7480\nregion = ap-south-1\n"
    )
    (tmp_path / "aws" / "credentials").write_text(
        "[edge]\naws_access_key_id = EDGEKEYFROMFILE0042\naws_secret_access_key = file-secret-never-shown\n"
    )
    rows, output = s3_rows(tmp_path, env)
    assert rows["upstream.s3.endpoint"] == ("http://ceph.example:7480 (profile edge)", "environment")
    assert rows["upstream.s3.region"] == ("ap-south-1 (profile edge)", "environment")
    assert rows["upstream.s3.credentials"][0].startswith("access key ...0042 (the shared credentials file")
    assert "file-secret-never-shown" not in output

    rows, _ = s3_rows(tmp_path, s3_environment(tmp_path))
    assert rows["upstream.s3.endpoint"] == ("AWS S3 (by region) (default)", "environment")
    assert rows["upstream.s3.credentials"][0].startswith("none (found nowhere: set AWS_ACCESS_KEY_ID")
    assert rows["upstream.s3.trusts"] == ("the system's CAs", "environment")


@pytest.mark.parametrize(
    ("variables", "said"),
    [
        ({"AWS_ENDPOINT_URL_S3": "minio.example:9000"}, "the S3 endpoint 'minio.example:9000' is not a URL"),
        ({"AWS_PROFILE": "no-such-profile"}, "The config profile (no-such-profile) could not be found"),
    ],
)
def test_an_aws_environment_every_write_would_fail_in_is_refused_before_the_start_naming_what(
    tmp_path: Path, variables: dict[str, str], said: str
) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(ROUTES))
    args = ["config", "show", "--manifest", str(path), "--data-dir", str(tmp_path / "data")]
    env = s3_environment(tmp_path, **variables)
    result = CliRunner().invoke(main, [*args, "--upstream-upload", "s3://lake/landing"], env=env)
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert "Traceback" not in result.output


def test_config_show_says_the_s3_environment_for_an_upload_link_of_the_manifest_too(tmp_path: Path) -> None:
    links = [{"name": "lake", "transport": "upload", "url": "s3://lake/landing"}]
    env = s3_environment(tmp_path, AWS_ENDPOINT_URL="http://ceph.example:7480")
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(ROUTES | {"upstream": {"links": links}}))
    args = ["config", "show", "--manifest", str(path), "--data-dir", str(tmp_path / "data")]
    result = CliRunner().invoke(main, args, env=env)  # no --upstream-upload: the single upstream is a folder
    assert result.exit_code == 0, result.output
    rows = shown(result.output)
    assert rows["upstream.s3.endpoint"] == ("http://ceph.example:7480 (AWS_ENDPOINT_URL)", "environment")
    assert rows["upstream.links"][0] == "lake (s3://lake/landing, 0/MiB)"
