"""What a hub is started with (``HubConfig``): its listeners, its limits, its hardware profile and its upstream,
as the command line (or a program that serves a hub, ``bench.demo``) gives them. Plain values with their own
checks; where each came from, and what the manifest makes of them, is ``edgehub.runtime.compose.settings``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

from edgehub.core.endpoints import (
    UPSTREAM_LANE,
)
from edgehub.core.sas import DEFAULT_MAX_TOKEN_LIFETIME_S
from edgehub.delivery import ExecutorSettings
from edgehub.hub.modules import DEFAULT_WINDOW
from edgehub.hub.twins import DEFAULT_TWIN_LIMITS, TwinLimits
from edgehub.runtime.profiles import Profile
from edgehub.store import FsyncPolicy
from edgehub.store.policy import DEFAULT_IDENTITY_SHARE
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, WireMode
from edgehub.upstream.segment import Codec, SegmentName

__all__ = ["DEFAULT_HOST_NAME", "HubConfig", "HubLimits", "Source", "UploadUpstreamSettings", "UpstreamOverrides"]


class Source(StrEnum):
    """Where a running setting's value came from; each layer is over the ones before it (settings.py)."""

    DEFAULT = "default"
    PROFILE = "profile"
    MANIFEST = "manifest"
    FLAG = "flag"  # given on the command line, or in the flag's environment variable
    # read by a plugin from its own standard environment, not by a flag of ours (AWS_* for an s3:// landing zone)
    ENVIRONMENT = "environment"


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
    # upstream.compression / --upstream-compression: gzip files (*.jsonl.gz), or zstd files (*.jsonl.zst) with a
    # dictionary each lane trains from its traffic and lands once (edgehub.upstream.upload_transport)
    compression: Codec = Codec.GZIP

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
    # MQTT and AMQP over WebSockets (protocol_heads.websocket): plain (off unless given) and TLS. The CLI's TLS
    # default is 443 with ``wss_port_optional``: served where the hub may bind it, else off (said at start).
    ws_port: int | None = None
    wss_port: int | None = None
    wss_port_optional: bool = False
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
    # The settings the command line gave, by their names in ``edgehub config show`` (``mqtts_port``,
    # ``store.fsync``, ``upstream.partitions``...): their source is ``flag`` (edgehub.runtime.compose.settings).
    flags: frozenset[str] = frozenset()

    @property
    def fsync(self) -> FsyncPolicy:
        """The store's fsync policy: the profile's (``--fsync`` applied over it)."""
        return self.profile.fsync
