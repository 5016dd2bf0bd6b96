"""``edgehub run``: its flags in option groups, the one function that turns them into what a hub is started with
(``run_config``, which ``edgehub config show`` calls too, so what it shows is what runs), and the lines ``run``
prints as the hub comes up (the compiled routes, the profile, the upstream and how it uses the link).

Invariants: a flag that does not parse, or two that contradict each other, is a usage error naming them before
anything starts; a setting's source is ``flag`` exactly when its flag was given on the command line or in its
environment variable (``SETTING_OF`` says which flag sets which setting).
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click
from click.core import ParameterSource

import edgehub
from edgehub.core import ConfigurationError, StoreError
from edgehub.core.units import parse_duration_s, parse_rate_bps
from edgehub.hub.lanes import UpstreamOptions
from edgehub.hub.modules import DEFAULT_WINDOW
from edgehub.manifest.documents import MAX_PARTITIONS, ManifestError, read_manifest_file
from edgehub.routing import RouteSpec
from edgehub.runtime.admin.server import DEFAULT_ADMIN_PORT
from edgehub.runtime.cli.firstrun import default_landing
from edgehub.runtime.cli.limits import limit_option_list, limits_from
from edgehub.runtime.cli.options import GroupedCommand, OptionGroup, grouped_options, option
from edgehub.runtime.cli.profile import describe_profile, profile_from, profile_option_list
from edgehub.runtime.cli.routes import describe_routes
from edgehub.runtime.cli.serving import loop_factory, serve_until_signalled, start_failures, tune_gc
from edgehub.runtime.compose.config import (
    DEFAULT_HOST_NAME,
    HubConfig,
    Source,
    UploadUpstreamSettings,
    UpstreamOverrides,
)
from edgehub.runtime.compose.links import link_spec
from edgehub.runtime.compose.settings import Setting, effective_settings
from edgehub.runtime.compose.upstream import LINK_KEYS, landing_zone
from edgehub.runtime.deployment.plan import DeploymentPlan, runnable
from edgehub.runtime.deployment.settings import StartSettings
from edgehub.runtime.logs import LogFormat, configure_logging
from edgehub.upstream.budget import describe_budgets
from edgehub.upstream.landing import shown_url
from edgehub.upstream.mqtt.settings import (
    MAX_PACKET_BYTES,
    MIN_PACKET_BYTES,
    MqttProtocol,
    MqttUpstreamSettings,
    ProxySettings,
    TlsSettings,
    WireMode,
)
from edgehub.upstream.s3env import s3_environment
from edgehub.upstream.segment import SEGMENT_SUFFIXES, Codec

__all__ = [
    "DEFAULT_MANIFEST",
    "SETTING_OF",
    "RunConfig",
    "refused",
    "run",
    "run_config",
    "run_option_groups",
    "show_transport",
    "show_upstream",
]

# Shipped inside the package, so an installed edgehub (a wheel, a container) has it too; deployment/examples/
# default.json is the same file for readers of the repository (tests/runtime/cli/test_firstrun.py keeps them equal).
DEFAULT_MANIFEST = Path(__file__).resolve().parents[1] / "default_manifest.json"


def run_option_groups() -> tuple[OptionGroup, ...]:
    """``edgehub run``'s flags, by section (new options each call: a command owns its parameters)."""
    return (
        OptionGroup(
            "Manifest and data",
            (
                option(
                    "--manifest",
                    type=click.Path(dir_okay=False, path_type=Path),
                    default=DEFAULT_MANIFEST,
                    help="The deployment manifest, watched while the hub runs (default: the one edgehub ships).",
                ),
                option(
                    "--data-dir",
                    type=click.Path(file_okay=False, path_type=Path),
                    default=Path("data"),
                    show_default=True,
                    help="The store, the certificates, the keys and the admin token.",
                ),
            ),
        ),
        OptionGroup(
            "Listeners",
            (
                option(
                    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default)."
                ),
                option(
                    "--host-name", default=DEFAULT_HOST_NAME, show_default=True, help="The hub's IoT Hub host name."
                ),
                option("--mqtt-port", type=int, default=None, help="Plain MQTT over TCP (off unless given)."),
                option("--mqtts-port", type=int, default=8883, show_default=True, help="MQTT over TLS."),
                option("--amqp-port", type=int, default=None, help="Plain AMQP 1.0 over TCP (off unless given)."),
                option("--amqps-port", type=int, default=5671, show_default=True, help="AMQP 1.0 over TLS."),
                option(
                    "--ws-port",
                    type=click.IntRange(0, 65535),
                    default=None,
                    help="MQTT and AMQP over plain WebSockets, path /$iothub/websocket (off unless given).",
                ),
                option(
                    "--wss-port",
                    type=click.IntRange(0, 65535),
                    default=443,
                    show_default=True,
                    envvar="EDGEHUB_WSS_PORT",
                    help="MQTT and AMQP over WebSockets with TLS, path /$iothub/websocket, as IoT Hub serves them; "
                    "by default only where the hub may bind 443 (else off, said at start), a given port always.",
                ),
                option("--no-wss", is_flag=True, default=False, help="Serve no WebSockets over TLS."),
                option(
                    "--no-amqp",
                    is_flag=True,
                    default=False,
                    help="Serve no AMQP at all (the AMQP head needs python-qpid-proton, which has no wheel for every "
                    "platform).",
                ),
                option(
                    "--admin-port",
                    type=click.IntRange(0, 65535),
                    default=DEFAULT_ADMIN_PORT,
                    show_default=True,
                    envvar="EDGEHUB_ADMIN_PORT",
                    help="The admin API and /metrics on 127.0.0.1 (0: any free port; DATA/admin.port says which). "
                    "Token: DATA/admin.token.",
                ),
            ),
        ),
        OptionGroup("Limits", limit_option_list()),
        OptionGroup("Hardware profile (over the built-in defaults)", profile_option_list()),
        OptionGroup(
            "Connections (against a hostile outside)",
            (
                option(
                    "--connect-timeout",
                    type=click.FloatRange(0.1, 300),
                    default=None,
                    metavar="SECS",
                    help="Time a new connection has for TLS, CONNECT and login (default 10; 2 while over half the "
                    "pre-login cap).",
                ),
                option(
                    "--max-connections",
                    type=click.IntRange(2),
                    default=None,
                    help="Connections at all (default: what the descriptor limit allows, two each, less a reserve of "
                    "256).",
                ),
                option(
                    "--max-pending-connections",
                    type=click.IntRange(1),
                    default=None,
                    help="Connections not yet logged in (default 256; at most half of --max-connections).",
                ),
                option(
                    "--max-pending-per-address",
                    type=click.IntRange(1),
                    default=None,
                    help="Connections not yet logged in from one source address (default 32; raise it for devices "
                    "behind one NAT).",
                ),
            ),
        ),
        OptionGroup(
            "Delivery",
            (
                option(
                    "--module-window",
                    type=click.IntRange(1, 65535),
                    default=DEFAULT_WINDOW,
                    show_default=True,
                    help="Deliveries in flight at once to each connected module (an MQTT 5 module's Receive Maximum "
                    "caps it); the manifest's delivery.moduleDeliveryWindow, when set, is applied over it, live.",
                ),
                option(
                    "--cleanup-interval",
                    type=click.FloatRange(0.1),
                    default=60.0,
                    show_default=True,
                    metavar="SECS",
                    help="How often each endpoint's delivered and expired messages are removed from the store (at "
                    "least 0.1).",
                ),
            ),
        ),
        OptionGroup(
            "Upstream transport",
            (
                option(
                    "--upstream-mqtt",
                    default=None,
                    metavar="HOST:PORT|URL",
                    help="Deliver $upstream to this MQTT broker: HOST:PORT over TCP, or ws://HOST[:PORT]/PATH or "
                    "wss://HOST[:PORT]/PATH over a WebSocket (wss: TLS, port 443 by default).",
                ),
                option(
                    "--upstream-proxy",
                    default=None,
                    metavar="HOST:PORT",
                    envvar="EDGEHUB_UPSTREAM_PROXY",
                    help="Reach the --upstream-mqtt broker through this HTTP proxy (CONNECT). Credentials, if it "
                    "asks for them: --upstream-proxy-credentials-file or $EDGEHUB_UPSTREAM_PROXY_CREDENTIALS "
                    "(USER:PASSWORD).",
                ),
                option(
                    "--upstream-proxy-credentials-file",
                    type=click.Path(dir_okay=False, exists=True, path_type=Path),
                    default=None,
                    help="A file whose first line is the proxy's USER:PASSWORD (kept out of the command line).",
                ),
                option(
                    "--upstream-upload",
                    default=None,
                    metavar="URL",
                    help="Land $upstream as segment files in this folder or fsspec URL (file:///data/landing; "
                    "s3://bucket/prefix "
                    "with s3fs installed). Not with --upstream-mqtt.",
                ),
                option(
                    "--no-upstream",
                    is_flag=True,
                    default=False,
                    help="Keep $upstream queued in the store (no transport). Default without "
                    "--upstream-mqtt/--upstream-upload: "
                    "upload to DATA_DIR/landing.",
                ),
                option(
                    "--upstream-client-id",
                    default="edgehub",
                    show_default=True,
                    help="Client id upstream, and the hub id that names segments (upload: its first folder).",
                ),
                option(
                    "--upstream-protocol",
                    type=click.Choice(["3.1.1", "5"]),
                    default="3.1.1",
                    show_default=True,
                    help="MQTT version.",
                ),
                option("--upstream-username", default=None, help="MQTT user name upstream."),
                option(
                    "--upstream-password",
                    default=None,
                    envvar="EDGEHUB_UPSTREAM_PASSWORD",
                    help="MQTT password upstream; better given in $EDGEHUB_UPSTREAM_PASSWORD than on the command line.",
                ),
                option(
                    "--upstream-sas-token",
                    default=None,
                    envvar="EDGEHUB_UPSTREAM_SAS_TOKEN",
                    help="An IoT Hub SAS token as the password (user name: the IoT Hub form); or "
                    "$EDGEHUB_UPSTREAM_SAS_TOKEN.",
                ),
                option("--upstream-tls", is_flag=True, default=False, help="TLS upstream, trusting the system's CAs."),
                option(
                    "--upstream-ca-file",
                    type=click.Path(dir_okay=False, exists=True, path_type=Path),
                    default=None,
                    help="TLS upstream, trusting this CA file (PEM).",
                ),
                option(
                    "--upstream-cert-file",
                    type=click.Path(dir_okay=False, exists=True, path_type=Path),
                    default=None,
                    help="Client certificate (PEM) for X.509 authentication; implies TLS.",
                ),
                option(
                    "--upstream-key-file",
                    type=click.Path(dir_okay=False, exists=True, path_type=Path),
                    default=None,
                    help="The client certificate's key (PEM), when not in the certificate file.",
                ),
            ),
        ),
        OptionGroup(
            "Upstream link (over the manifest's upstream section)",
            (
                option(
                    "--upstream-wire",
                    type=click.Choice(["batch", "message"]),
                    default=None,
                    help="Wire mode (overrides upstream.wireMode; default batch).",
                ),
                option(
                    "--upstream-max-uplink",
                    default=None,
                    metavar="RATE",
                    help="Cap on the upstream rate, e.g. 32kbit (overrides upstream.maxUplinkBps; default none).",
                ),
                option(
                    "--upstream-batch-bytes",
                    type=click.IntRange(256),
                    default=None,
                    help="Wire bytes per batch (maxBatchBytes).",
                ),
                option(
                    "--upstream-linger-ms",
                    type=click.IntRange(0, 60_000),
                    default=None,
                    help="Batch linger (lingerMs).",
                ),
                option(
                    "--upstream-window-bytes",
                    type=click.IntRange(512),
                    default=None,
                    help="Unacknowledged bytes in flight (maxInflightBytes; default one BDP of the link hints plus one "
                    "batch).",
                ),
                option(
                    "--upstream-compression",
                    type=click.Choice(["gzip", "zstd"]),
                    default=None,
                    help="Segment codec in batch mode and for uploads (overrides upstream.compression; default "
                    "gzip; zstd trains a dictionary per lane from its traffic).",
                ),
                option(
                    "--upstream-link-rate", default=None, metavar="RATE", help="Link hint, e.g. 64kbit (linkRateBps)."
                ),
                option(
                    "--upstream-link-rtt", default=None, metavar="DURATION", help="Link hint, e.g. 600ms (linkRttMs)."
                ),
                option(
                    "--upstream-max-packet-bytes",
                    type=click.IntRange(MIN_PACKET_BYTES, MAX_PACKET_BYTES),
                    default=None,
                    help="Largest MQTT packet taken from the broker (maxPacketBytes; default 1 MiB).",
                ),
                option(
                    "--upstream-broker-max-packet-bytes",
                    type=click.IntRange(MIN_PACKET_BYTES, MAX_PACKET_BYTES),
                    default=None,
                    help="Largest MQTT packet the broker takes, for one that does not announce it, e.g. MQTT 3.1.1 "
                    "(brokerMaxPacketBytes; default: as the broker announces).",
                ),
            ),
        ),
        OptionGroup(
            "Upstream lanes (over the manifest's upstream section)",
            (
                option(
                    "--upstream-partitions",
                    type=click.IntRange(1, MAX_PARTITIONS),
                    default=None,
                    help="Upstream lanes (overrides the manifest's upstream.partitions; default 1).",
                ),
                option(
                    "--duplicate-detection/--no-duplicate-detection",
                    default=None,
                    help="Drop a message whose id the same identity sent inside the window (overrides "
                    "upstream.duplicateDetection).",
                ),
                option(
                    "--duplicate-window-secs",
                    type=click.IntRange(1, 604_800),
                    default=None,
                    help="The duplicate-detection window (overrides upstream.duplicateDetectionWindowSecs; default "
                    "600).",
                ),
            ),
        ),
        OptionGroup(
            "Logging",
            (
                option(
                    "--log-level",
                    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
                    default="info",
                    show_default=True,
                    help="Least level logged. INFO shows every refusal (rate-limited per peer) and each connection.",
                ),
                option(
                    "--log-format",
                    type=click.Choice([f.value for f in LogFormat]),
                    default=LogFormat.TEXT.value,
                    show_default=True,
                    help="text for a terminal; json: one object per line (ts, level, logger, event, message, key=value "
                    "fields) "
                    "for journald and log shippers.",
                ),
            ),
        ),
    )


# Which setting of ``edgehub config show`` each flag sets (edgehub.runtime.compose.settings names them).
SETTING_OF: Mapping[str, tuple[str, ...]] = {
    "manifest": ("manifest",),
    "data_dir": ("data_dir",),
    "host": ("host",),
    "host_name": ("host_name",),
    "mqtt_port": ("mqtt_port",),
    "mqtts_port": ("mqtts_port",),
    "amqp_port": ("amqp_port",),
    "amqps_port": ("amqps_port",),
    "no_amqp": ("amqp_port", "amqps_port"),
    "ws_port": ("ws_port",),
    "wss_port": ("wss_port",),
    "no_wss": ("wss_port",),
    "admin_port": ("admin_port",),
    "max_token_lifetime": ("limits.max_token_lifetime_s",),
    "store_quota": ("store.max_bytes",),
    "identity_share": ("store.identity_share",),
    "profile_name": ("profile",),
    "fsync": ("store.fsync",),
    "fsync_interval_ms": ("store.fsync_interval_ms",),
    "event_loop": ("runtime.event_loop",),
    "connect_timeout": ("connect_timeout_s",),
    "max_connections": ("max_connections",),
    "max_pending_connections": ("max_pending_connections",),
    "max_pending_per_address": ("max_pending_per_address",),
    "module_window": ("delivery.module_window",),
    "cleanup_interval": ("delivery.cleanup_interval_s",),
    "upstream_mqtt": ("upstream.transport",),
    "upstream_upload": ("upstream.transport",),
    "no_upstream": ("upstream.transport",),
    "upstream_client_id": ("upstream.client_id",),
    "upstream_protocol": ("upstream.protocol",),
    "upstream_username": ("upstream.username",),
    "upstream_password": ("upstream.password",),
    "upstream_sas_token": ("upstream.sas_token",),
    "upstream_tls": ("upstream.tls",),
    "upstream_proxy": ("upstream.proxy",),
    "upstream_proxy_credentials_file": ("upstream.proxy",),
    "upstream_ca_file": ("upstream.tls",),
    "upstream_cert_file": ("upstream.tls",),
    "upstream_key_file": ("upstream.tls",),
    "upstream_wire": ("upstream.wire_mode",),
    "upstream_max_uplink": ("upstream.max_uplink_bps",),
    "upstream_batch_bytes": ("upstream.max_batch_bytes",),
    "upstream_linger_ms": ("upstream.linger_s",),
    "upstream_window_bytes": ("upstream.max_inflight_bytes",),
    "upstream_compression": ("upstream.compression",),
    "upstream_link_rate": ("upstream.link_rate_bps",),
    "upstream_link_rtt": ("upstream.link_rtt_s",),
    "upstream_max_packet_bytes": ("upstream.max_packet_bytes",),
    "upstream_broker_max_packet_bytes": ("upstream.broker_max_packet_bytes",),
    "upstream_partitions": ("upstream.partitions",),
    "duplicate_detection": ("upstream.duplicate_detection",),
    "duplicate_window_secs": ("upstream.duplicate_window_s",),
    "log_level": ("log.level",),
    "log_format": ("log.format",),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """What ``edgehub run``'s flags say: the hub's config, and how it logs (not the hub's, the process's)."""

    hub: HubConfig
    log_level: str
    log_format: LogFormat

    def log_settings(self) -> tuple[Setting, ...]:
        """The logging rows of ``edgehub config show``."""
        flags = self.hub.flags
        return (
            Setting("log.level", self.log_level, Source.FLAG if "log.level" in flags else Source.DEFAULT),
            Setting("log.format", self.log_format.value, Source.FLAG if "log.format" in flags else Source.DEFAULT),
        )


def given_flags(ctx: click.Context) -> frozenset[str]:
    """The settings whose flag was given, on the command line or in its environment variable."""
    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return frozenset(
        setting
        for name, settings in SETTING_OF.items()
        if ctx.get_parameter_source(name) in given
        for setting in settings
    )


def run_config(ctx: click.Context, params: Mapping[str, Any]) -> RunConfig:
    """The config of a hub started with ``params`` (``edgehub run``'s, by parameter name); a usage error for
    flags that do not parse or do not go together. ``edgehub run`` serves it, ``edgehub config show`` shows it."""
    p = params
    upstream = _upstream(p)
    overrides = UpstreamOverrides(
        wire_mode=WireMode(p["upstream_wire"]) if p["upstream_wire"] else None,
        max_uplink_bps=_parsed(parse_rate_bps, p["upstream_max_uplink"], "--upstream-max-uplink"),
        max_batch_bytes=p["upstream_batch_bytes"],
        linger_s=p["upstream_linger_ms"] / 1000 if p["upstream_linger_ms"] is not None else None,
        max_inflight_bytes=p["upstream_window_bytes"],
        link_rate_bps=_parsed(parse_rate_bps, p["upstream_link_rate"], "--upstream-link-rate"),
        link_rtt_s=_parsed(parse_duration_s, p["upstream_link_rtt"], "--upstream-link-rtt"),
        compression=Codec(p["upstream_compression"]) if p["upstream_compression"] else None,
        max_packet_bytes=p["upstream_max_packet_bytes"],
        broker_max_packet_bytes=p["upstream_broker_max_packet_bytes"],
    )
    window = p["duplicate_window_secs"]
    hub = HubConfig(
        manifest=p["manifest"],
        data_dir=p["data_dir"],
        host=p["host"],
        mqtt_port=p["mqtt_port"],
        mqtts_port=p["mqtts_port"],
        amqp_port=None if p["no_amqp"] else p["amqp_port"],
        amqps_port=None if p["no_amqp"] else p["amqps_port"],
        ws_port=p["ws_port"],
        wss_port=None if p["no_wss"] else p["wss_port"],
        wss_port_optional=ctx.get_parameter_source("wss_port") is ParameterSource.DEFAULT,
        host_name=p["host_name"],
        module_window=p["module_window"],
        cleanup_interval_s=p["cleanup_interval"],
        upstream=upstream,
        partitions=p["upstream_partitions"],
        duplicate_detection=p["duplicate_detection"],
        duplicate_window_s=float(window) if window is not None else None,
        upstream_overrides=overrides,
        connect_timeout_s=p["connect_timeout"],
        max_connections=p["max_connections"],
        max_pending_connections=p["max_pending_connections"],
        max_pending_per_address=p["max_pending_per_address"],
        limits=limits_from(p["max_token_lifetime"], p["store_quota"], p["identity_share"]),
        admin_port=p["admin_port"],
        profile=profile_from(p["profile_name"], p["fsync"], p["fsync_interval_ms"], p["event_loop"]),
        flags=given_flags(ctx),
    )
    return RunConfig(hub=hub, log_level=p["log_level"], log_format=LogFormat(p["log_format"]))


def _upstream(p: Mapping[str, Any]) -> MqttUpstreamSettings | UploadUpstreamSettings | None:
    """Where ``$upstream`` goes: an MQTT broker, a landing zone (``DATA_DIR/landing`` unless told), or nowhere."""
    mqtt, upload = p["upstream_mqtt"], p["upstream_upload"]
    if mqtt is not None and upload is not None:
        raise click.UsageError("--upstream-mqtt and --upstream-upload are two transports for $upstream: give one")
    if p["no_upstream"]:
        if mqtt is not None or upload is not None:
            raise click.UsageError(
                "--no-upstream keeps $upstream queued: not with --upstream-mqtt or --upstream-upload"
            )
        return None
    if mqtt is None:
        url = upload if upload is not None else str(default_landing(p["data_dir"]))  # firstrun.py: the whole path
        return _upload_settings(url, p["upstream_client_id"])
    up_host, up_port, websocket_path, wss = _broker_address(mqtt)
    tls = None
    ca, cert, key = p["upstream_ca_file"], p["upstream_cert_file"], p["upstream_key_file"]
    if p["upstream_tls"] or ca or cert or wss:
        tls = TlsSettings(
            ca_certs=str(ca) if ca else None,
            certfile=str(cert) if cert else None,
            keyfile=str(key) if key else None,
        )
    client_id = p["upstream_client_id"]
    return MqttUpstreamSettings(
        host=up_host,
        port=up_port,
        websocket_path=websocket_path,
        proxy=_proxy(p["upstream_proxy"], p["upstream_proxy_credentials_file"]),
        client_id=client_id,
        hub_id=client_id.replace("/", "-"),
        protocol=MqttProtocol(p["upstream_protocol"]),
        username=p["upstream_username"],
        password=p["upstream_password"],
        sas_token=p["upstream_sas_token"],
        tls=tls,
    )


def _broker_address(value: str) -> tuple[str, int, str | None, bool]:
    """``--upstream-mqtt``: host, port, WebSocket path (None: MQTT over TCP), and whether the URL asks for TLS."""
    if value.startswith(("ws://", "wss://")):
        url = urllib.parse.urlsplit(value)
        try:
            port = url.port
        except ValueError:
            port = -1
        if not url.hostname or port == -1:
            raise click.BadParameter("expected ws://HOST[:PORT]/PATH or wss://...", param_hint="--upstream-mqtt")
        wss = url.scheme == "wss"
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        return url.hostname, port or (443 if wss else 80), path, wss
    host, _, port_text = value.rpartition(":")
    if not host or not port_text.isdigit():
        raise click.BadParameter("expected HOST:PORT or a ws:// or wss:// URL", param_hint="--upstream-mqtt")
    return host, int(port_text), None, False


def _proxy(address: str | None, credentials_file: Path | None) -> ProxySettings | None:
    """``--upstream-proxy`` with its credentials from the file, else from the environment (never a flag's value:
    a command line is visible to every user of the machine)."""
    if address is None:
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter("expected HOST:PORT", param_hint="--upstream-proxy")
    if credentials_file is not None:
        lines = credentials_file.read_text().splitlines()
        credentials = lines[0] if lines else ""
    else:
        credentials = os.environ.get("EDGEHUB_UPSTREAM_PROXY_CREDENTIALS", "")
    if credentials and ":" not in credentials:
        raise click.BadParameter("proxy credentials must be USER:PASSWORD", param_hint="--upstream-proxy")
    user, _, password = credentials.partition(":")
    return ProxySettings(host.strip("[]"), int(port), username=user or None, password=password or None)


def show_routes(manifest: Path, plan: DeploymentPlan) -> None:
    """Print the version and the compiled routes of ``manifest`` (checked: ``plan``)."""
    router = runnable(plan, StartSettings()).router
    specs = {r.name: RouteSpec(r.text, r.priority, r.time_to_live_secs) for r in plan.routes}
    click.echo(f"edgehub {edgehub.__version__}")
    click.echo(f"manifest: {manifest}")
    for line in describe_routes(specs, router, int(plan.settings.default_ttl_s)):
        click.echo(f"  {line}")


def refused(manifest: Path, exc: ManifestError) -> NoReturn:
    click.echo(f"{manifest}: refused", err=True)
    for error in exc.errors:
        click.echo(f"  {error}", err=True)
    raise SystemExit(1) from None


def _manifest_error(exc: BaseException) -> ManifestError | None:
    """The ManifestError ``exc`` is, or the one alone in its group (the start's task groups wrap it)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, ManifestError) else None


def show_upstream(options: UpstreamOptions) -> None:
    """Print the partition count and duplicate detection the hub will run with."""
    detection = f"on, window {options.duplicate_window_s:g}s" if options.duplicate_detection else "off"
    click.echo(f"upstream: partitions={options.partitions} duplicate detection {detection}")


def show_transport(settings: MqttUpstreamSettings | UploadUpstreamSettings | None) -> None:
    """Print where ``$upstream`` goes and how it uses the link (secrets left out)."""
    if settings is None:
        click.echo("upstream transport: none ($upstream stays queued)")
        return
    if isinstance(settings, UploadUpstreamSettings):
        codec = settings.compression
        dictionary = ", a dictionary per lane trained and landed once" if codec is Codec.ZSTD else ""
        click.echo(
            f"upstream transport: upload to {shown_url(settings.url)} hub={settings.hub_id} "
            f"(one {codec} segment file per batch, {{hub}}/{{lane}}/p{{NN}}/{{first}}-{{last}}"
            f"{SEGMENT_SUFFIXES[codec]}{dictionary})"
            + (f" uplink cap {settings.max_uplink_bps:g} bit/s" if settings.max_uplink_bps else "")
        )
        if settings.url.startswith(("s3://", "s3a://")):
            # what the standard AWS environment gives s3fs (edgehub.upstream.s3env); the credential chain is left to
            # the first write (its last links may ask the network) and to `edgehub config show`
            env = s3_environment(look_up_credentials=False)
            if env is not None:
                where = f"endpoint {env.endpoint} ({env.endpoint_from}) region {env.region} ({env.region_from})"
                click.echo(f"upstream s3: {where}")
        return
    s = settings
    auth = "sas token" if s.sas_token else "password" if s.password else "none"
    if s.tls is not None and s.tls.certfile:
        auth += " + client certificate"
    cap = f"{s.max_uplink_bps:g} bit/s" if s.max_uplink_bps else "none"
    click.echo(
        f"upstream transport: mqtt {s.protocol} {s.host}:{s.port} tls={'on' if s.tls else 'off'} auth={auth} "
        f"wire={s.wire_mode} codec={s.compression} batch={s.segment_bytes} B window={s.window_bytes} B "
        f"linger={s.linger_s:g} s max uplink={cap} max packet in={s.max_packet_bytes} B "
        f"out={f'{s.broker_max_packet_bytes} B' if s.broker_max_packet_bytes else 'as announced'}"
    )


# The flags that set up the MQTT transport: refused next to --upstream-upload rather than silently ignored.
_MQTT_ONLY_FLAGS = (
    "upstream_wire",
    "upstream_protocol",
    "upstream_username",
    "upstream_password",
    "upstream_sas_token",
    "upstream_tls",
    "upstream_ca_file",
    "upstream_cert_file",
    "upstream_key_file",
    "upstream_proxy",
    "upstream_proxy_credentials_file",
    "upstream_batch_bytes",
    "upstream_linger_ms",
    "upstream_window_bytes",
    "upstream_link_rate",
    "upstream_link_rtt",
    "upstream_max_packet_bytes",
    "upstream_broker_max_packet_bytes",
)
# The manifest's upstream keys that only the MQTT transport reads (maxUplinkBps caps uploads too, and compression
# chooses their codec).
_MQTT_LINK_KEYS = tuple(key for key in LINK_KEYS.values() if key not in ("maxUplinkBps", "compression"))


def _upload_settings(url: str, client_id: str) -> UploadUpstreamSettings:
    """``--upstream-upload URL`` checked before the hub starts: the MQTT-only flags are not given on the command
    line (an environment variable such as $EDGEHUB_UPSTREAM_PASSWORD is left alone), the URL's fsspec protocol
    is installed, and the client id makes a valid segment name part."""
    ctx = click.get_current_context()
    given = [
        f"--{name.replace('_', '-')}"
        for name in _MQTT_ONLY_FLAGS
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    ]
    if given:
        raise click.UsageError(
            f"{', '.join(given)} set up the MQTT transport; they do not apply to --upstream-upload "
            "(the default without --upstream-mqtt)"
        )
    try:
        settings = UploadUpstreamSettings(url=url, hub_id=client_id.replace("/", "-"))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--upstream-client-id" if url else "--upstream-upload") from None
    try:
        landing_zone(url)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--upstream-upload") from None
    return settings


def _parsed(parse: Callable[[str], float], text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None


@grouped_options(run_option_groups())
@click.command(cls=GroupedCommand)
@click.pass_context
def run(ctx: click.Context, /, **params: Any) -> None:
    """Start the hub: print the compiled routes, then serve MQTT until SIGTERM or SIGINT."""
    started = run_config(ctx, params)
    config, manifest, profile = started.hub, started.hub.manifest, started.hub.profile
    try:
        document = read_manifest_file(manifest)
    except ManifestError as exc:
        refused(manifest, exc)

    def checked(plan: DeploymentPlan) -> None:
        # Checked in a child process (every problem at once, route errors included) while the hub opens its store:
        # the serving hub never loads the manifest's models nor the route parser (edgehub.runtime.deployment.plan).
        show_routes(manifest, plan)
        click.echo(describe_profile(profile))
        effective = effective_settings(config, plan.settings)  # what serve runs with, from the same function
        up = plan.settings.upstream
        show_upstream(effective.upstream)
        links = up.get("links")
        if links:  # they replace the command line's transport (edgehub.runtime.compose.links)
            for link in links:
                click.echo(
                    f"upstream link {link['name']}: {link.get('transport', 'mqtt')} "
                    f"{link.get('address') or shown_url(link.get('url') or '')} cost/MiB={link['costPerMiB']} "
                    f"priorities={link['priorities']} budget={describe_budgets(link_spec(link).budgets)}"
                )
        else:
            show_transport(effective.transport)
        if isinstance(config.upstream, UploadUpstreamSettings) and not links:
            unused = [key for key in _MQTT_LINK_KEYS if up.get(key) is not None]
            if unused:
                click.echo(f"upstream: manifest keys {', '.join(unused)} are the MQTT transport's; not used by upload")
        click.echo(f"event loop: {loop_name}")

    configure_logging(started.log_level, started.log_format)
    tune_gc()
    loop_name, factory = loop_factory(profile.event_loop)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve_until_signalled(config, document=document, on_checked=checked))
    except (ConfigurationError, StoreError, OSError, ExceptionGroup) as exc:
        refusal = _manifest_error(exc)
        if refusal is not None:
            refused(manifest, refusal)
        reasons = start_failures(exc)
        if reasons is None:
            raise
        click.echo(f"edgehub: {'; '.join(reasons)}", err=True)
        raise SystemExit(1) from None
    click.echo("stopped")
