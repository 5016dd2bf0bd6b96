"""The composition root: the store, the router, the hub facade and the MQTT and AMQP heads, wired and run until
stopped.

``serve(config, stop=event)`` runs until ``stop`` is set (the CLI sets it on SIGTERM/SIGINT), then stops in
order: the listeners and their clients first (so no ack is promised after the store closes), then the
executors, then the store (closed, so every acknowledged message is on disk).

Before it opens the store, ``serve`` reads every record of it with checksums verified (``open_store(verify=True)``):
a damaged store raises ``StoreCorruptionError`` before anything is written to it, its message saying the damage,
the path and the way out (``edgehub store check`` / ``repair``, ``damaged_store_advice``), and the hub does not
start (the CLI exits 1 with that message, no traceback).

``$upstream``: when ``HubConfig.upstream`` names an MQTT broker or parent hub (``MqttUpstreamSettings``,
``edgehub run --upstream-mqtt``), an ``MqttUpstream`` transport delivers it; when it names a landing zone
(``UploadUpstreamSettings``, ``edgehub run --upstream-upload``), an ``UploadTransport`` writes one segment file per
batch there through a ``LandingZone`` (fsspec: a folder, or s3/abfs/... with the plugin installed); otherwise
messages routed there stay queued in the store (they survive restarts and go out once an upstream is configured;
``edgehub run`` uploads to ``DATA_DIR/landing`` unless told otherwise, ``edgehub.runtime.firstrun``).
Over MQTT, the first lane's connection also serves the cloud's side: it subscribes for the devices the hub knows,
and the messages for them and the direct method calls it receives go to the hub (``edgehub.upstream.mqtt.cloud``).

How the transport uses its link (``wireMode``, ``maxUplinkBps``, ``maxBatchBytes``, ``lingerMs``,
``maxInflightBytes``, ``linkRateBps``, ``linkRttMs``, ``compression``, ``maxPacketBytes``, ``brokerMaxPacketBytes``)
comes from the manifest's ``upstream`` section applied over ``HubConfig.upstream``, and
``HubConfig.upstream_overrides`` (the CLI's ``--upstream-*`` flags) over both (``transport_settings``). Credentials
and TLS come from ``HubConfig.upstream`` only (the CLI), never the manifest. The link settings are the MQTT
transport's; the upload transport takes none of them (its batches are the executor's, up to
``UploadTransport.max_batch_messages``, and each is one file), except ``maxUplinkBps``, which caps the bytes it
writes too.

Partitions and duplicate detection come from the manifest's ``upstream`` section, each overridable in
``HubConfig`` (the CLI's ``--upstream-partitions``, ``--duplicate-detection``, ``--duplicate-window-secs``).
With ``partitions`` N > 1 there is one transport per lane ``$upstream/{i}``: an ``MqttUpstream``
(``lane_settings``) with its own connection, client id ``{client_id}-p{i}`` and segment lane ``upstream-p{i}``, or
an ``UploadTransport`` (``upload_lane``) whose segment files carry the lane ``upstream-p{i}`` in their names. A
lane the store still holds undelivered messages for but that the partition count no longer names (after N
changed) gets a transport too, so what it held still goes out; new messages never go to it, and once drained it
is left out at the next start.

The admin API (``HubConfig.admin_port``, ``edgehub run --admin-port``; ``edgehub.runtime.admin_runtime``) listens
on 127.0.0.1 beside the MQTT head, from when the head listens until it stops.

The deployment (issue 17): the manifest is checked whole before anything starts (in a child process,
``check_deployment``: the serving hub never loads pydantic, the manifest's models or lark), then a
``DeploymentController`` (``edgehub.runtime.deployment``) applies it to the running hub, watches the file and
applies it again when it changes, applies desired patches from the cloud over the first upstream lane's MQTT
connection (``TwinChannel``) and reports back over it; the MQTT head's ACL asks the controller's grants.

Limits (``HubConfig.limits``, ``HubLimits``; the CLI's ``--max-token-lifetime``, ``--store-quota``,
``--identity-share``): how far ahead a SAS token may expire (a year), the twins' sizes (``TwinLimits``), and the
store's byte quota, by default derived at start from the free space of the store's filesystem
(``disk_store_quota``: what it holds plus half the free space, at most 32 GiB), with each identity's share of it
(a quarter). No store quota at all only when asked for (``store_max_bytes=None``, ``--store-quota none``).

The hardware profile (``HubConfig.profile``, ``edgehub run --profile``; ``edgehub.runtime.profiles``) gives the
store its RocksDB memory budget, fsync policy and group size, and the upstream transports their batch size in
messages (under the manifest's and the command line's settings, ``transport_settings``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from edgehub.core import ConfigurationError, StoreCorruptionError, SystemClock, TransportError
from edgehub.core.endpoints import (
    UPSTREAM_LANE,
    is_upstream_endpoint,
    lane_name_of,
    parse_upstream_lane_id,
    upstream_lane_id,
)
from edgehub.core.sas import DEFAULT_MAX_TOKEN_LIFETIME_S
from edgehub.delivery import Endpoint, ExecutorSettings
from edgehub.hub.facade import EdgeHub
from edgehub.hub.identities import IdentityRegistry
from edgehub.hub.lanes import UpstreamOptions
from edgehub.hub.modules import DEFAULT_WINDOW
from edgehub.hub.twins import DEFAULT_TWIN_LIMITS, TwinLimits
from edgehub.manifest.documents import read_manifest_file
from edgehub.runtime.admin_api import DesiredStateService
from edgehub.runtime.admin_runtime import LiveConnections, serve_admin
from edgehub.runtime.certs import HubCerts, ensure_certs, server_ssl_context
from edgehub.runtime.data_dir import tighten_data_dir
from edgehub.runtime.deployment import DeploymentController, kept_plan
from edgehub.runtime.deployment_plan import DeploymentPlan, PendingCheck, runnable
from edgehub.runtime.deployment_settings import StartSettings
from edgehub.runtime.keyseal import ensure_sealer
from edgehub.runtime.memory import ChurnCollector
from edgehub.runtime.profiles import Profile
from edgehub.store import FsyncPolicy, Store, StoreQuota
from edgehub.store.policy import DEFAULT_IDENTITY_SHARE, disk_store_quota
from edgehub.store.rocks import open_rocks_store
from edgehub.store.salvage import check_store
from edgehub.upstream.landing import LandingZone
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, WireMode
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.segment import Codec, SegmentName
from edgehub.upstream.twin_channel import TwinChannel
from edgehub.upstream.upload_transport import UploadTransport
from protocol_heads.mqtt.iothub import Acl
from protocol_heads.mqtt.server import MqttServer, MqttSettings

__all__ = [
    "DEFAULT_HOST_NAME",
    "HubConfig",
    "HubLimits",
    "UploadUpstreamSettings",
    "UpstreamOverrides",
    "damaged_store_advice",
    "landing_zone",
    "lane_settings",
    "open_identities",
    "raise_descriptor_limit",
    "seal_clear_identity_keys",
    "serve",
    "store_quota",
    "transport_settings",
    "upload_lane",
    "upstream_options",
]

log = logging.getLogger(__name__)

# The IoT Hub host name of connection strings and SAS resources, and the gateway name clients dial (the server
# certificate's SAN holds it).
DEFAULT_HOST_NAME = "localhost"


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamOverrides:
    """Link settings given on the command line; each None is left to the manifest (then the transport)."""

    wire_mode: WireMode | None = None
    max_uplink_bps: float | None = None
    max_batch_bytes: int | None = None
    linger_s: float | None = None
    max_inflight_bytes: int | None = None
    link_rate_bps: float | None = None
    link_rtt_s: float | None = None
    compression: Codec | None = None
    max_packet_bytes: int | None = None
    broker_max_packet_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadUpstreamSettings:
    """``$upstream`` as segment files in a landing zone: ``url`` is a folder path or an fsspec URL
    (``file:///data/landing``, ``s3://bucket/prefix`` with s3fs installed, ...); ``hub_id`` is the first part
    of every segment's name (``{hub_id}/{lane}/p{NN}/{first}-{last}.jsonl.gz``)."""

    url: str
    hub_id: str = "edgehub"
    max_uplink_bps: float | None = None  # maxUplinkBps: a cap on the bytes written, as on MQTT's PUBLISH bytes
    max_batch_messages: int = 10_000  # the most messages in one segment file

    def __post_init__(self) -> None:
        if not self.url:
            raise ValueError("the landing zone url must not be empty")
        if self.max_batch_messages < 1:
            raise ValueError("max_batch_messages must be positive")
        SegmentName(hub_id=self.hub_id, lane=UPSTREAM_LANE, priority=0, first_offset=0, last_offset=0)  # validates


@dataclass(frozen=True, slots=True, kw_only=True)
class HubLimits:
    """What the hub accepts at most; see the module docstring."""

    max_token_lifetime_s: float | None = DEFAULT_MAX_TOKEN_LIFETIME_S  # None: no limit
    store_max_bytes: int | Literal["auto"] | None = "auto"  # "auto": from the free disk at start; None: none
    identity_share: float | None = DEFAULT_IDENTITY_SHARE  # of the store quota, per device or module
    twin: TwinLimits = DEFAULT_TWIN_LIMITS

    def __post_init__(self) -> None:
        if self.max_token_lifetime_s is not None and self.max_token_lifetime_s <= 0:
            raise ValueError("max_token_lifetime_s must be positive (None: no limit)")
        if isinstance(self.store_max_bytes, int) and self.store_max_bytes < 1:
            raise ValueError("store_max_bytes must be positive (None: no quota)")
        if self.identity_share is not None and not 0 < self.identity_share <= 1:
            raise ValueError("identity_share must be within (0, 1] (None: no per-identity share)")


@dataclass(frozen=True, slots=True, kw_only=True)
class HubConfig:
    manifest: Path
    data_dir: Path
    host: str = "127.0.0.1"  # loopback unless asked: a fresh hub with no identities should not face a network
    mqtt_port: int | None = None  # plain TCP, off unless given
    mqtts_port: int | None = 8883
    # The AMQP head: TLS (the CLI's default is 5671) and plain TCP, each off unless given (None).
    amqp_port: int | None = None
    amqps_port: int | None = None
    host_name: str = DEFAULT_HOST_NAME
    module_window: int = DEFAULT_WINDOW  # deliveries in flight per module link
    cleanup_interval_s: float = ExecutorSettings().cleanup_interval_s  # delivered/expired references removed
    profile: Profile = field(default_factory=Profile)  # the board's store and batch settings (fsync among them)
    upstream: MqttUpstreamSettings | UploadUpstreamSettings | None = None  # None: $upstream stays queued
    # None: as the manifest's upstream section says (which defaults to 1 partition, detection off, 600 s).
    partitions: int | None = None
    duplicate_detection: bool | None = None
    duplicate_window_s: float | None = None
    upstream_overrides: UpstreamOverrides = field(default_factory=UpstreamOverrides)
    # The MQTT head's limits against a hostile outside (MqttSettings documents each; None: its default).
    connect_timeout_s: float | None = None
    max_connections: int | None = None
    max_pending_connections: int | None = None
    max_pending_per_address: int | None = None
    limits: HubLimits = field(default_factory=HubLimits)
    admin_port: int | None = None  # the admin API on 127.0.0.1 (0: any free port; None: off; the CLI: 9600)

    @property
    def fsync(self) -> FsyncPolicy:
        """The store's fsync policy: the profile's (``--fsync`` applied over it)."""
        return self.profile.fsync


def raise_descriptor_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard one (often 1,024 against 524,288): the MQTT head sizes its
    connection cap from it. Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("runtime.nofile_not_raised soft=%d hard=%d detail=%s", soft, hard, exc)
    return soft


def store_path(data_dir: Path) -> Path:
    return data_dir / "store"


def open_store(
    data_dir: Path,
    *,
    default_ttl_s: float = 7200.0,
    profile: Profile | None = None,
    verify: bool = False,
) -> Store:
    """The hub's store in ``data_dir``, with the RocksDB budget, fsync policy and group size of ``profile`` (None:
    the built-in defaults). ``verify`` reads every record first (the hub does at start: a flipped byte is found
    only by reading it). A damaged store raises ``StoreCorruptionError`` saying what to do. The data directory is
    made private first (``tighten_data_dir``)."""
    p = profile or Profile()
    tighten_data_dir(data_dir)
    path = store_path(data_dir)
    try:
        if verify and path.is_dir() and any(path.iterdir()):
            # read-only first: a damaged store is refused before the read-write open rewrites its MANIFEST
            started = time.monotonic()
            records = sum(check_store(path).values())
            log.info("store.verified path=%s records=%d seconds=%.3f", path, records, time.monotonic() - started)
        return open_rocks_store(
            path,
            tuning=p.rocks,
            default_ttl_s=default_ttl_s,
            fsync=p.fsync,
            fsync_interval_ms=p.fsync_interval_ms,
            max_group=p.max_group,
            held_max_bytes=p.held_max_bytes,
        )
    except StoreCorruptionError as exc:
        raise StoreCorruptionError(damaged_store_advice(exc, data_dir), path=exc.path) from exc


def damaged_store_advice(exc: StoreCorruptionError, data_dir: Path) -> str:
    """``exc`` with what an operator can do about it (docs/operating.md, "A damaged store")."""
    return (
        f"{exc}\n"
        "The hub did not start and changed nothing in the store. To recover:\n"
        f"  edgehub store check --data-dir {data_dir}    reads every record and reports the damage\n"
        f"  edgehub store repair --data-dir {data_dir}   keeps a copy aside, then recovers what can be read\n"
        f"  or move {exc.path} aside and start with an empty store (what it holds is then not delivered)"
    )


def store_quota(store: Store, path: Path, limits: HubLimits) -> StoreQuota:
    """The store's quota for this run: ``limits.store_max_bytes``, or (``"auto"``) one from the free space of the
    filesystem at ``path`` and what ``store`` holds now; with each identity's share."""
    max_bytes = limits.store_max_bytes
    if max_bytes == "auto":
        max_bytes = disk_store_quota(path, store.usage(None)[1])
    quota = StoreQuota(max_bytes=max_bytes, identity_share=limits.identity_share)
    log.info(
        "runtime.store_quota max_bytes=%s identity_max_bytes=%s source=%s",
        quota.max_bytes,
        quota.identity_max_bytes,
        "disk" if limits.store_max_bytes == "auto" else "setting",
    )
    return quota


def open_identities(store: Store, host_name: str, *, data_dir: Path) -> IdentityRegistry:
    """The identity registry over ``store`` (``data_dir``'s), sealing the keys it writes with ``data_dir``'s seal
    key (``edgehub.runtime.keyseal``; made when there is none)."""
    return IdentityRegistry(store, host_name=host_name, clock=SystemClock(), sealer=ensure_sealer(data_dir))


async def seal_clear_identity_keys(registry: IdentityRegistry) -> None:
    """Seal the symmetric keys an older hub kept in clear (on every open of a data directory's identities:
    nothing to do costs one scan of the identity records), and say what was found."""
    sealed, unopenable = await registry.seal_clear_keys()
    if sealed:
        log.info("identity.keys_sealed count=%d why=kept_in_clear_by_an_older_hub", sealed)
    if unopenable:
        log.warning(
            "identity.keys_unopenable count=%d why=sealed_with_another_seal_key advice=%s",
            unopenable,
            "restore the original identity-seal.key, or give these identities new keys (edgehub identity add)",
        )


def upstream_options(up: Mapping[str, Any], config: HubConfig) -> UpstreamOptions:
    """The manifest's ``upstream`` section (checked, every key) with the config's overrides applied."""
    return UpstreamOptions(
        partitions=config.partitions if config.partitions is not None else up["partitions"],
        duplicate_detection=(
            config.duplicate_detection if config.duplicate_detection is not None else up["duplicateDetection"]
        ),
        duplicate_window_s=(
            config.duplicate_window_s
            if config.duplicate_window_s is not None
            else float(up["duplicateDetectionWindowSecs"])
        ),
    )


def transport_settings(
    up: Mapping[str, Any], config: HubConfig
) -> MqttUpstreamSettings | UploadUpstreamSettings | None:
    """``config.upstream`` with the profile's batch size, then the manifest's link settings, then the overrides
    applied; None without one. The link settings are the MQTT transport's: an ``UploadUpstreamSettings`` takes the
    profile's batch size and ``maxUplinkBps`` only."""
    if config.upstream is None:
        return None
    base = config.upstream
    if config.profile.max_batch_messages is not None:
        base = replace(base, max_batch_messages=config.profile.max_batch_messages)
    cap_bps = up.get("maxUplinkBps")
    if isinstance(base, UploadUpstreamSettings):
        cap = config.upstream_overrides.max_uplink_bps or (float(cap_bps) if cap_bps else None)
        return replace(base, max_uplink_bps=cap) if cap is not None else base
    wire, linger_ms, rate_bps, rtt_ms, codec = (
        up.get(k) for k in ("wireMode", "lingerMs", "linkRateBps", "linkRttMs", "compression")
    )
    manifest: dict[str, object] = {
        "wire_mode": WireMode(wire) if wire is not None else None,
        "max_uplink_bps": float(cap_bps) if cap_bps is not None else None,
        "max_batch_bytes": up.get("maxBatchBytes"),
        "linger_s": linger_ms / 1000 if linger_ms is not None else None,
        "max_inflight_bytes": up.get("maxInflightBytes"),
        "link_rate_bps": float(rate_bps) if rate_bps is not None else None,
        "link_rtt_s": rtt_ms / 1000 if rtt_ms is not None else None,
        "compression": Codec(codec) if codec is not None else None,
        "max_packet_bytes": up.get("maxPacketBytes"),
        "broker_max_packet_bytes": up.get("brokerMaxPacketBytes"),
    }
    o = config.upstream_overrides
    cli: dict[str, object] = {name: getattr(o, name) for name in manifest}
    changes = {k: v for k, v in manifest.items() if v is not None} | {k: v for k, v in cli.items() if v is not None}
    try:
        return replace(base, **changes)  # type: ignore[arg-type]
    except ValueError as exc:  # e.g. zstd without the zstandard package
        raise ConfigurationError(f"upstream: {exc}") from exc


def lane_settings(base: MqttUpstreamSettings, lane_id: str) -> MqttUpstreamSettings:
    """The transport settings of one lane: ``$upstream`` keeps ``base``; ``$upstream/{i}`` gets its endpoint id,
    the client id suffix ``-p{i}`` (each lane is its own MQTT session) and the segment lane ``upstream-p{i}``."""
    partition = parse_upstream_lane_id(lane_id)
    if partition is None:
        if not is_upstream_endpoint(lane_id):
            raise ValueError(f"{lane_id!r} is not an upstream lane")
        return base
    return replace(base, endpoint_id=lane_id, lane=lane_name_of(partition), client_id=f"{base.client_id}-p{partition}")


def landing_zone(url: str) -> LandingZone:
    """The landing zone at ``url``; ``ConfigurationError`` when its fsspec protocol is unknown or its plugin is not
    installed (``s3://`` without s3fs)."""
    try:
        return LandingZone(url)
    except TransportError as exc:
        raise ConfigurationError(f"upstream upload: {exc}") from exc


def upload_lane(settings: UploadUpstreamSettings, lane_id: str) -> UploadTransport:
    """The upload transport of one lane: ``$upstream`` writes lane ``upstream``, ``$upstream/{i}`` lane
    ``upstream-p{i}``, each through its own ``LandingZone`` on ``settings.url``."""
    if not is_upstream_endpoint(lane_id):
        raise ValueError(f"{lane_id!r} is not an upstream lane")
    lane = lane_name_of(parse_upstream_lane_id(lane_id))
    return UploadTransport(
        landing_zone(settings.url),
        hub_id=settings.hub_id,
        lane=lane,
        endpoint_id=lane_id,
        max_uplink_bps=settings.max_uplink_bps,
        max_batch_messages=settings.max_batch_messages,
    )


def _lane_ids(store: Store, options: UpstreamOptions) -> list[str]:
    """The lanes of ``options``, and any other upstream lane the store still holds undelivered messages for (to
    drain it; once drained it is left out at the next start)."""
    lanes = [upstream_lane_id(i, options.partitions) for i in range(options.partitions)]
    for q in store.queues():
        if q.endpoint in lanes or not is_upstream_endpoint(q.endpoint):
            continue
        if store.end_offset(q) > store.checkpoint(q).committed + 1:
            log.info("runtime.leftover_lane endpoint=%s partitions=%d", q.endpoint, options.partitions)
            lanes.append(q.endpoint)
    return lanes


@contextlib.asynccontextmanager
async def _admin(
    config: HubConfig,
    hub: EdgeHub,
    server: MqttServer,
    *,
    other_heads: Sequence[LiveConnections] = (),
    desired: DesiredStateService | None = None,
) -> AsyncIterator[int | None]:
    """The admin API while the hub serves (its port), unless ``config.admin_port`` is None; ``desired`` serves
    its deployment routes (the ``DeploymentController``; without one they answer 503); identities it removes or
    rotates lose their connections on ``server`` and ``other_heads``."""
    if config.admin_port is None:
        yield None
        return
    async with serve_admin(
        config.data_dir, port=config.admin_port, hub=hub, server=server, other_heads=other_heads, desired=desired
    ) as http:
        yield http.port


async def serve(
    config: HubConfig,
    *,
    stop: asyncio.Event,
    on_certs: Callable[[HubCerts], None] | None = None,
    on_ready: Callable[[dict[str, int]], None] | None = None,
    on_hub: Callable[[EdgeHub], None] | None = None,
    on_checked: Callable[[DeploymentPlan], None] | None = None,
    document: Any = None,
) -> None:
    """Run the hub until ``stop`` is set (see the module docstring). ``on_certs``, ``on_checked`` (the manifest's
    plan), ``on_ready`` (the ports) and ``on_hub`` (the running facade, for a tool that watches its queues:
    ``bench.demo``) are called on the way up. ``document``: the manifest file's, when the caller read it.

    The manifest is checked in a child process while this one opens its store (a restart's start-up is the longer
    of the two, not their sum; one whose file is unchanged runs the plan the store kept and ends the check, see
    ``kept_plan``); on a first start (no data directory yet) the answer comes first, so a refused
    manifest leaves nothing behind. A refused manifest stops the start (``ManifestError``) with the store closed."""
    if document is None:
        document = read_manifest_file(config.manifest)
    pending = await PendingCheck.start(document)
    plan: DeploymentPlan | None = None
    try:
        if not config.data_dir.exists():
            plan = await pending.answer()
            if on_checked is not None:
                on_checked(plan)
        raise_descriptor_limit()
        tighten_data_dir(config.data_dir)  # before anything is made in it (data_dir.py)
        sealer = ensure_sealer(config.data_dir)
        certs = ensure_certs(config.data_dir / "certs", extra_names=(config.host_name,))
        tls = config.mqtts_port is not None or config.amqps_port is not None
        ssl_context = server_ssl_context(certs) if tls else None
        store = open_store(config.data_dir, profile=config.profile, verify=True)  # the TTL is the deployment's
    except BaseException:
        await pending.close()  # a start that fails before it wants the answer ends the check
        raise
    endpoints: list[Endpoint] = []
    twin: TwinChannel | None = None
    try:
        if plan is None:
            try:  # a restart whose file is unchanged runs the plan the store kept, and the check is ended
                plan = kept_plan(store, config.manifest, document) or await pending.answer()
            finally:
                await pending.close()  # idempotent
            if on_checked is not None:
                on_checked(plan)
        if on_certs is not None:  # told after the plan, so a start's lines come in their order whatever came first
            on_certs(certs)
        wanted = plan.settings
        store.default_ttl_s = wanted.default_ttl_s
        router = runnable(plan, StartSettings()).router  # the controller applies the deployment whole below
        options = upstream_options(wanted.upstream, config)
        transport = transport_settings(wanted.upstream, config)
        store.store_quota = store_quota(store, store_path(config.data_dir), config.limits)
        if isinstance(transport, UploadUpstreamSettings):
            endpoints.extend(upload_lane(transport, lane_id) for lane_id in _lane_ids(store, options))
        elif transport is not None:
            for lane_id in _lane_ids(store, options):
                upstream = MqttUpstream(lane_settings(transport, lane_id), keeper=store)  # keeps its dictionary
                if twin is None:  # the first lane's connection carries the hub's own twin (issue 17)
                    twin = TwinChannel()
                    upstream.attach_twin(twin)
                await upstream.start()  # the executor closes it when the hub stops
                endpoints.append(upstream)
        async with EdgeHub(
            store=store,
            router=router,
            host_name=config.host_name,
            endpoints=endpoints,
            upstream=options,
            executor_settings=ExecutorSettings(cleanup_interval_s=config.cleanup_interval_s),
            max_token_lifetime_s=config.limits.max_token_lifetime_s,
            twin_limits=config.limits.twin,
            sealer=sealer,
        ) as hub:
            await seal_clear_identity_keys(hub.identities)  # before any head serves a login
            if on_hub is not None:
                on_hub(hub)
            # The cloud's device-bound messages and method calls come over the first MQTT lane (upstream.mqtt.cloud).
            cloud = next((e for e in endpoints if isinstance(e, MqttUpstream)), None)
            if cloud is not None:
                cloud.serve_cloud(hub, refusals=hub.refusals)
            controller = DeploymentController(
                hub,
                StartSettings(
                    executor=ExecutorSettings(cleanup_interval_s=config.cleanup_interval_s),
                    store_quota=store.store_quota,
                    fsync=config.fsync,
                    module_window=config.module_window,
                    upstream=wanted.upstream,
                ),
            )
            await controller.start(config.manifest, checked=(document, plan))  # or the store's if unchanged
            if twin is not None:
                controller.on_reported(twin.report)
                twin.report(controller.reported())
                twin.bind(
                    functools.partial(controller.patch_desired, source="cloud"),
                    put=functools.partial(controller.put_desired, source="cloud"),
                    running_version=lambda: controller.running_version,
                )
            limits: dict[str, Any] = {
                name: value
                for name in (
                    "connect_timeout_s",
                    "max_connections",
                    "max_pending_connections",
                    "max_pending_per_address",
                )
                if (value := getattr(config, name)) is not None
            }
            settings = MqttSettings(
                host=config.host,
                tcp_port=config.mqtt_port,
                tls_port=config.mqtts_port,
                ssl_context=ssl_context,
                outbound_window=config.module_window,
                acl=Acl(publish_grants=controller.publish_grants, subscribe_grants=controller.subscribe_grants),
                **limits,
            )
            async with MqttServer(hub, settings=settings) as server, AsyncExitStack() as heads:
                ports = dict(server.ports)
                other_heads: list[LiveConnections] = []
                if config.amqp_port is not None or config.amqps_port is not None:
                    # Imported only when AMQP is served: python-qpid-proton is built from source where PyPI has
                    # no wheel (aarch64), and a hub started with --no-amqp runs without it.
                    from protocol_heads.amqp import AmqpServer, AmqpSettings

                    amqp = AmqpSettings(
                        host=config.host,
                        tcp_port=config.amqp_port,
                        tls_port=config.amqps_port,
                        ssl_context=ssl_context,
                        outbound_window=config.module_window,
                        **limits,
                    )
                    amqp_server = await heads.enter_async_context(AmqpServer(hub, settings=amqp))
                    ports.update(amqp_server.ports)
                    other_heads.append(amqp_server)
                admin_port = await heads.enter_async_context(
                    _admin(config, hub, server, other_heads=other_heads, desired=controller)
                )
                tasks = await heads.enter_async_context(asyncio.TaskGroup())
                collector = tasks.create_task(ChurnCollector(server.limiter).run(), name="runtime.memory")
                watcher = tasks.create_task(controller.watch(config.manifest), name="runtime.deployment_watch")
                log.info("runtime.ready ports=%s admin_port=%s", ports, admin_port)
                if on_ready is not None:
                    on_ready(ports | ({"admin": admin_port} if admin_port is not None else {}))
                await stop.wait()
                log.info("runtime.stopping")
                collector.cancel()
                watcher.cancel()
    finally:
        if twin is not None:
            await twin.close()
        for endpoint in endpoints:
            await endpoint.close()  # idempotent; covers a failure before the executor took it
        await store.close()
        log.info("runtime.stopped")
