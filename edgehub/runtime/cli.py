"""The ``edgehub`` command line.

``run`` and ``routes`` are imported with this module; the other commands (capacity, identity, link-sim, status,
deadletter, store) are imported when named (``_Commands``): a serving hub never runs them and does not carry
their modules (measured: about 0.3 MB of the idle hub's RSS).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, NoReturn

import click
from click.core import ParameterSource

import edgehub
from edgehub.core import ConfigurationError, StoreError
from edgehub.core.units import parse_duration_s, parse_rate_bps
from edgehub.hub.lanes import UpstreamOptions
from edgehub.hub.modules import DEFAULT_WINDOW
from edgehub.manifest.documents import MAX_PARTITIONS, ManifestError, read_manifest_file
from edgehub.routing import RouteSpec
from edgehub.runtime.admin_runtime import DEFAULT_ADMIN_PORT
from edgehub.runtime.data_dir import private_umask
from edgehub.runtime.deployment_plan import DeploymentPlan, runnable
from edgehub.runtime.deployment_settings import StartSettings
from edgehub.runtime.firstrun import default_landing, sas_token
from edgehub.runtime.hub_runtime import (
    DEFAULT_HOST_NAME,
    HubConfig,
    HubLimits,
    UploadUpstreamSettings,
    UpstreamOverrides,
    landing_zone,
    transport_settings,
    upstream_options,
)
from edgehub.runtime.limits_cli import limit_options
from edgehub.runtime.logs import LogFormat, configure_logging
from edgehub.runtime.profile_cli import describe_profile, profile_options
from edgehub.runtime.profiles import Profile
from edgehub.runtime.routes_cli import describe_routes, routes
from edgehub.runtime.serving import loop_factory, serve_until_signalled, start_failures, tune_gc
from edgehub.upstream.mqtt.settings import (
    MAX_PACKET_BYTES,
    MIN_PACKET_BYTES,
    MqttProtocol,
    MqttUpstreamSettings,
    TlsSettings,
    WireMode,
)
from edgehub.upstream.segment import Codec

__all__ = ["DEFAULT_MANIFEST", "main"]

# Shipped inside the package, so an installed edgehub (a wheel, a container) has it too; deployment/examples/
# default.json is the same file for readers of the repository (tests/runtime/test_firstrun.py keeps them equal).
DEFAULT_MANIFEST = Path(__file__).resolve().parent / "default_manifest.json"


class _Commands(click.Group):
    """The command group, with the commands a serving hub never runs imported when named (module docstring)."""

    lazy: ClassVar[dict[str, tuple[str, str]]] = {  # command name -> (module, attribute): the one list of them
        "capacity": ("edgehub.runtime.capacity_cli", "capacity"),
        "deadletter": ("edgehub.runtime.status_cli", "deadletter"),
        "identity": ("edgehub.runtime.identity_cli", "identity"),
        "link-sim": ("edgehub.runtime.linksim_cli", "link_sim"),
        "status": ("edgehub.runtime.status_cli", "status"),
        "store": ("edgehub.runtime.store_cli", "store"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module, attribute = self.lazy[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands)
@click.version_option(edgehub.__version__, prog_name="edgehub")
@click.pass_context
def main(ctx: click.Context) -> None:
    """edgehub: an IoT edge hub for gateways on thin, flaky uplinks."""
    # Every command may create files in the data directory (RocksDB's among them, made with RocksDB's own modes):
    # umask 077 makes them private from their first byte (data_dir.py). Given back when the command ends, for a
    # program that runs commands in process (click's test runner).
    previous = private_umask()
    ctx.call_on_close(lambda: os.umask(previous))


main.add_command(routes)
main.add_command(sas_token)


def show_routes(manifest: Path, plan: DeploymentPlan) -> None:
    """Print the version and the compiled routes of ``manifest`` (checked: ``plan``)."""
    router = runnable(plan, StartSettings()).router
    specs = {r.name: RouteSpec(r.text, r.priority, r.time_to_live_secs) for r in plan.routes}
    click.echo(f"edgehub {edgehub.__version__}")
    click.echo(f"manifest: {manifest}")
    for line in describe_routes(specs, router, int(plan.settings.default_ttl_s)):
        click.echo(f"  {line}")


def _refused(manifest: Path, exc: ManifestError) -> NoReturn:
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
        click.echo(
            f"upstream transport: upload to {_without_password(settings.url)} hub={settings.hub_id} "
            "(one gzip segment file per batch, {hub}/{lane}/p{NN}/{first}-{last}.jsonl.gz)"
            + (f" uplink cap {settings.max_uplink_bps:g} bit/s" if settings.max_uplink_bps else "")
        )
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


def _without_password(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part (sftp, ftp, ...) replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostport}{slash}{path}"


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
    "upstream_batch_bytes",
    "upstream_linger_ms",
    "upstream_window_bytes",
    "upstream_compression",
    "upstream_link_rate",
    "upstream_link_rtt",
    "upstream_max_packet_bytes",
    "upstream_broker_max_packet_bytes",
)
# The manifest's upstream keys that only the MQTT transport reads (maxUplinkBps caps uploads too).
_MQTT_LINK_KEYS = (
    "wireMode",
    "maxBatchBytes",
    "lingerMs",
    "maxInflightBytes",
    "linkRateBps",
    "linkRttMs",
    "compression",
    "maxPacketBytes",
    "brokerMaxPacketBytes",
)


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


@main.command()
@limit_options  # --max-token-lifetime, --store-quota, --identity-share (edgehub.runtime.limits_cli) as ``limits``
@profile_options  # --profile, --fsync, --fsync-interval-ms (edgehub.runtime.profile_cli) as ``profile``
@click.option("--manifest", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_MANIFEST)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data"), show_default=True)
@click.option("--mqtt-port", type=int, default=None, help="Plain MQTT over TCP (off unless given).")
@click.option("--mqtts-port", type=int, default=8883, show_default=True, help="MQTT over TLS.")
@click.option("--amqp-port", type=int, default=None, help="Plain AMQP 1.0 over TCP (off unless given).")
@click.option("--amqps-port", type=int, default=5671, show_default=True, help="AMQP 1.0 over TLS.")
@click.option(
    "--no-amqp",
    is_flag=True,
    default=False,
    help="Serve no AMQP at all (the AMQP head needs python-qpid-proton, which has no wheel for every platform).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--host-name", default=DEFAULT_HOST_NAME, show_default=True, help="The hub's IoT Hub host name.")
@click.option(
    "--module-window",
    type=click.IntRange(1, 65535),
    default=DEFAULT_WINDOW,
    show_default=True,
    help="Deliveries in flight at once to each connected module (an MQTT 5 module's Receive Maximum caps it).",
)
@click.option(
    "--cleanup-interval",
    type=click.FloatRange(0.1),
    default=60.0,
    show_default=True,
    metavar="SECS",
    help="How often each endpoint's delivered and expired messages are removed from the store (at least 0.1).",
)
@click.option("--upstream-mqtt", default=None, metavar="HOST:PORT", help="Deliver $upstream to this MQTT broker.")
@click.option(
    "--upstream-upload",
    default=None,
    metavar="URL",
    help="Land $upstream as segment files in this folder or fsspec URL (file:///data/landing; s3://bucket/prefix "
    "with s3fs installed). Not with --upstream-mqtt.",
)
@click.option(
    "--no-upstream",
    is_flag=True,
    default=False,
    help="Keep $upstream queued in the store (no transport). Default without --upstream-mqtt/--upstream-upload: "
    "upload to DATA_DIR/landing.",
)
@click.option(
    "--upstream-client-id",
    default="edgehub",
    show_default=True,
    help="Client id upstream, and the hub id that names segments (upload: its first folder).",
)
@click.option(
    "--upstream-wire",
    type=click.Choice(["batch", "message"]),
    default=None,
    help="Wire mode (overrides upstream.wireMode; default batch).",
)
@click.option(
    "--upstream-protocol", type=click.Choice(["3.1.1", "5"]), default="3.1.1", show_default=True, help="MQTT version."
)
@click.option("--upstream-username", default=None, help="MQTT user name upstream.")
@click.option(
    "--upstream-password",
    default=None,
    envvar="EDGEHUB_UPSTREAM_PASSWORD",
    help="MQTT password upstream; better given in $EDGEHUB_UPSTREAM_PASSWORD than on the command line.",
)
@click.option(
    "--upstream-sas-token",
    default=None,
    envvar="EDGEHUB_UPSTREAM_SAS_TOKEN",
    help="An IoT Hub SAS token as the password (user name: the IoT Hub form); or $EDGEHUB_UPSTREAM_SAS_TOKEN.",
)
@click.option("--upstream-tls", is_flag=True, default=False, help="TLS upstream, trusting the system's CAs.")
@click.option(
    "--upstream-ca-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="TLS upstream, trusting this CA file (PEM).",
)
@click.option(
    "--upstream-cert-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Client certificate (PEM) for X.509 authentication; implies TLS.",
)
@click.option(
    "--upstream-key-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="The client certificate's key (PEM), when not in the certificate file.",
)
@click.option(
    "--upstream-max-uplink",
    default=None,
    metavar="RATE",
    help="Cap on the upstream rate, e.g. 32kbit (overrides upstream.maxUplinkBps; default none).",
)
@click.option(
    "--upstream-batch-bytes", type=click.IntRange(256), default=None, help="Wire bytes per batch (maxBatchBytes)."
)
@click.option("--upstream-linger-ms", type=click.IntRange(0, 60_000), default=None, help="Batch linger (lingerMs).")
@click.option(
    "--upstream-window-bytes",
    type=click.IntRange(512),
    default=None,
    help="Unacknowledged bytes in flight (maxInflightBytes; default one BDP of the link hints plus one batch).",
)
@click.option(
    "--upstream-compression",
    type=click.Choice(["gzip", "zstd"]),
    default=None,
    help="Segment codec in batch mode (overrides upstream.compression; default gzip; zstd needs edgehub[zstd]).",
)
@click.option("--upstream-link-rate", default=None, metavar="RATE", help="Link hint, e.g. 64kbit (linkRateBps).")
@click.option("--upstream-link-rtt", default=None, metavar="DURATION", help="Link hint, e.g. 600ms (linkRttMs).")
@click.option(
    "--upstream-max-packet-bytes",
    type=click.IntRange(MIN_PACKET_BYTES, MAX_PACKET_BYTES),
    default=None,
    help="Largest MQTT packet taken from the broker (maxPacketBytes; default 1 MiB).",
)
@click.option(
    "--upstream-broker-max-packet-bytes",
    type=click.IntRange(MIN_PACKET_BYTES, MAX_PACKET_BYTES),
    default=None,
    help="Largest MQTT packet the broker takes, for one that does not announce it, e.g. MQTT 3.1.1 "
    "(brokerMaxPacketBytes; default: as the broker announces).",
)
@click.option(
    "--upstream-partitions",
    type=click.IntRange(1, MAX_PARTITIONS),
    default=None,
    help="Upstream lanes (overrides the manifest's upstream.partitions; default 1).",
)
@click.option(
    "--duplicate-detection/--no-duplicate-detection",
    default=None,
    help="Drop a message whose id the same identity sent inside the window (overrides upstream.duplicateDetection).",
)
@click.option(
    "--duplicate-window-secs",
    type=click.IntRange(1, 604_800),
    default=None,
    help="The duplicate-detection window (overrides upstream.duplicateDetectionWindowSecs; default 600).",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(0.1, 300),
    default=None,
    metavar="SECS",
    help="Time a new connection has for TLS, CONNECT and login (default 10; 2 while over half the pre-login cap).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(2),
    default=None,
    help="Connections at all (default: what the descriptor limit allows, two each, less a reserve of 256).",
)
@click.option(
    "--max-pending-connections",
    type=click.IntRange(1),
    default=None,
    help="Connections not yet logged in (default 256; at most half of --max-connections).",
)
@click.option(
    "--max-pending-per-address",
    type=click.IntRange(1),
    default=None,
    help="Connections not yet logged in from one source address (default 32; raise it for devices behind one NAT).",
)
@click.option(
    "--admin-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_ADMIN_PORT,
    show_default=True,
    envvar="EDGEHUB_ADMIN_PORT",
    help="The admin API and /metrics on 127.0.0.1 (0: any free port; DATA/admin.port says which). "
    "Token: DATA/admin.token.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    help="Least level logged. INFO shows every refusal (rate-limited per peer) and each connection.",
)
@click.option(
    "--log-format",
    type=click.Choice([f.value for f in LogFormat]),
    default=LogFormat.TEXT.value,
    show_default=True,
    help="text for a terminal; json: one object per line (ts, level, logger, event, message, key=value fields) "
    "for journald and log shippers.",
)
def run(
    limits: HubLimits,
    profile: Profile,
    manifest: Path,
    data_dir: Path,
    mqtt_port: int | None,
    mqtts_port: int,
    amqp_port: int | None,
    amqps_port: int,
    no_amqp: bool,
    host: str,
    host_name: str,
    module_window: int,
    cleanup_interval: float,
    upstream_mqtt: str | None,
    upstream_upload: str | None,
    no_upstream: bool,
    upstream_client_id: str,
    upstream_wire: str | None,
    upstream_protocol: str,
    upstream_username: str | None,
    upstream_password: str | None,
    upstream_sas_token: str | None,
    upstream_tls: bool,
    upstream_ca_file: Path | None,
    upstream_cert_file: Path | None,
    upstream_key_file: Path | None,
    upstream_max_uplink: str | None,
    upstream_batch_bytes: int | None,
    upstream_linger_ms: int | None,
    upstream_window_bytes: int | None,
    upstream_link_rate: str | None,
    upstream_link_rtt: str | None,
    upstream_compression: str | None,
    upstream_max_packet_bytes: int | None,
    upstream_broker_max_packet_bytes: int | None,
    upstream_partitions: int | None,
    duplicate_detection: bool | None,
    duplicate_window_secs: int | None,
    connect_timeout: float | None,
    max_connections: int | None,
    max_pending_connections: int | None,
    max_pending_per_address: int | None,
    admin_port: int,
    log_level: str,
    log_format: str,
) -> None:
    """Start the hub: print the compiled routes, then serve MQTT until SIGTERM or SIGINT."""
    upstream: MqttUpstreamSettings | UploadUpstreamSettings | None = None
    if upstream_mqtt is not None and upstream_upload is not None:
        raise click.UsageError("--upstream-mqtt and --upstream-upload are two transports for $upstream: give one")
    if no_upstream and (upstream_mqtt is not None or upstream_upload is not None):
        raise click.UsageError("--no-upstream keeps $upstream queued: not with --upstream-mqtt or --upstream-upload")
    if upstream_mqtt is None and not no_upstream and upstream_upload is None:
        upstream_upload = str(default_landing(data_dir))  # the first run shows the whole path (firstrun.py)
    if upstream_upload is not None:
        upstream = _upload_settings(upstream_upload, upstream_client_id)
    elif upstream_mqtt is not None:
        up_host, _, up_port = upstream_mqtt.rpartition(":")
        if not up_host or not up_port.isdigit():
            raise click.BadParameter("expected HOST:PORT", param_hint="--upstream-mqtt")
        tls = None
        if upstream_tls or upstream_ca_file or upstream_cert_file:
            tls = TlsSettings(
                ca_certs=str(upstream_ca_file) if upstream_ca_file else None,
                certfile=str(upstream_cert_file) if upstream_cert_file else None,
                keyfile=str(upstream_key_file) if upstream_key_file else None,
            )
        upstream = MqttUpstreamSettings(
            host=up_host,
            port=int(up_port),
            client_id=upstream_client_id,
            hub_id=upstream_client_id.replace("/", "-"),
            protocol=MqttProtocol(upstream_protocol),
            username=upstream_username,
            password=upstream_password,
            sas_token=upstream_sas_token,
            tls=tls,
        )
    overrides = UpstreamOverrides(
        wire_mode=WireMode(upstream_wire) if upstream_wire else None,
        max_uplink_bps=_parsed(parse_rate_bps, upstream_max_uplink, "--upstream-max-uplink"),
        max_batch_bytes=upstream_batch_bytes,
        linger_s=upstream_linger_ms / 1000 if upstream_linger_ms is not None else None,
        max_inflight_bytes=upstream_window_bytes,
        link_rate_bps=_parsed(parse_rate_bps, upstream_link_rate, "--upstream-link-rate"),
        link_rtt_s=_parsed(parse_duration_s, upstream_link_rtt, "--upstream-link-rtt"),
        compression=Codec(upstream_compression) if upstream_compression else None,
        max_packet_bytes=upstream_max_packet_bytes,
        broker_max_packet_bytes=upstream_broker_max_packet_bytes,
    )
    config = HubConfig(
        manifest=manifest,
        data_dir=data_dir,
        host=host,
        mqtt_port=mqtt_port,
        mqtts_port=mqtts_port,
        amqp_port=None if no_amqp else amqp_port,
        amqps_port=None if no_amqp else amqps_port,
        host_name=host_name,
        module_window=module_window,
        cleanup_interval_s=cleanup_interval,
        upstream=upstream,
        partitions=upstream_partitions,
        duplicate_detection=duplicate_detection,
        duplicate_window_s=float(duplicate_window_secs) if duplicate_window_secs is not None else None,
        upstream_overrides=overrides,
        connect_timeout_s=connect_timeout,
        max_connections=max_connections,
        max_pending_connections=max_pending_connections,
        max_pending_per_address=max_pending_per_address,
        limits=limits,
        admin_port=admin_port,
        profile=profile,
    )
    try:
        document = read_manifest_file(manifest)
    except ManifestError as exc:
        _refused(manifest, exc)

    def checked(plan: DeploymentPlan) -> None:
        # Checked in a child process (every problem at once, route errors included) while the hub opens its store:
        # the serving hub never loads the manifest's models nor the route parser (edgehub.runtime.deployment_plan).
        show_routes(manifest, plan)
        click.echo(describe_profile(profile))
        up = plan.settings.upstream
        show_upstream(upstream_options(up, config))
        show_transport(transport_settings(up, config))
        if isinstance(upstream, UploadUpstreamSettings):
            unused = [key for key in _MQTT_LINK_KEYS if up.get(key) is not None]
            if unused:
                click.echo(f"upstream: manifest keys {', '.join(unused)} are the MQTT transport's; not used by upload")
        click.echo(f"event loop: {loop_name}")

    configure_logging(log_level, LogFormat(log_format))
    tune_gc()
    loop_name, factory = loop_factory(profile.event_loop)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve_until_signalled(config, document=document, on_checked=checked))
    except (ConfigurationError, StoreError, OSError, ExceptionGroup) as exc:
        refused = _manifest_error(exc)
        if refused is not None:
            _refused(manifest, refused)
        reasons = start_failures(exc)
        if reasons is None:
            raise
        click.echo(f"edgehub: {'; '.join(reasons)}", err=True)
        raise SystemExit(1) from None
    click.echo("stopped")
