"""Every setting a running hub uses, and where its value came from.

Four layers, each over the one before: the built-in **default**, the hardware **profile** (``--profile``), the
**manifest** (its ``upstream`` section and ``storeAndForwardConfiguration``) and the command line's **flag** (or the
flag's environment variable). ``effective_settings(config, wanted)`` lays them over each other once: ``serve`` runs
with what it returns (the upstream's lanes and transport, the store's TTL, the executors' base, the heads' limits),
and ``edgehub run`` and ``edgehub config show`` print its ``table``, so what is shown is what runs.

The deployment's store and delivery settings are the one exception to "a flag over the manifest": ``fsync``,
``fsyncIntervalMs``, ``maxStoreBytes``, ``maxStoreMessages``, ``identityShare``, ``cleanupIntervalSecs`` and
``moduleDeliveryWindow`` are applied over the command line's at every deployment
(``edgehub.runtime.deployment.settings``), so that a live update changes them without a restart; when the manifest
sets one, its source is ``manifest``.

Invariants: every row of the table has exactly one source, and its name is unique; a value the hub settles only
once it runs (the store quota ``auto``, a head limit left to the head) is shown as the rule it follows, not guessed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

from edgehub.delivery import ExecutorSettings
from edgehub.hub.lanes import UpstreamOptions
from edgehub.runtime.compose.config import HubConfig, Source, UploadUpstreamSettings
from edgehub.runtime.compose.upstream import LINK_KEYS, transport_settings, upstream_options
from edgehub.runtime.deployment.wants import DesiredSettings
from edgehub.store.tuning import RocksTuning
from edgehub.upstream.landing import shown_url
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings

__all__ = ["HEAD_LIMITS", "EffectiveSettings", "Setting", "Source", "effective_settings"]

# The MQTT and AMQP heads' limits against a hostile outside: given on the command line, or left to the head.
HEAD_LIMITS = ("connect_timeout_s", "max_connections", "max_pending_connections", "max_pending_per_address")
_AUTO_QUOTA = "auto (at start: what it holds plus half the free disk, at most 32 GiB)"
_LISTENERS = (
    "host",
    "host_name",
    "mqtt_port",
    "mqtts_port",
    "amqp_port",
    "amqps_port",
    "ws_port",
    "wss_port",
    "admin_port",
)


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of ``edgehub config show``: a setting's name, its effective value as shown, and its source."""

    name: str
    value: str
    source: Source


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectiveSettings:
    """What a hub runs with once its manifest is checked; see the module docstring."""

    upstream: UpstreamOptions
    transport: MqttUpstreamSettings | UploadUpstreamSettings | None
    default_ttl_s: float
    executor: ExecutorSettings  # the base each deployment fills its executors' settings from
    head_limits: dict[str, Any]  # the heads' limits the command line gave (the others are the heads' defaults)
    table: tuple[Setting, ...]

    def setting(self, name: str) -> Setting:
        """The row called ``name``; ``KeyError`` naming it when there is none."""
        for row in self.table:
            if row.name == name:
                return row
        raise KeyError(f"no setting {name!r}")


def effective_settings(config: HubConfig, wanted: DesiredSettings) -> EffectiveSettings:
    """``config`` (defaults, profile, flags) and ``wanted`` (the checked manifest) laid over each other."""
    rows = (
        *_listeners(config),
        *_profile(config, wanted),
        *_deployed_store(config, wanted),
        *_upstream(config, wanted),
    )
    names = [row.name for row in rows]
    if len(names) != len(set(names)):  # two layers naming one setting differently would hide one of them
        raise ValueError(f"settings named twice: {sorted({n for n in names if names.count(n) > 1})}")
    return EffectiveSettings(
        upstream=upstream_options(wanted.upstream, config),
        transport=transport_settings(wanted.upstream, config),
        default_ttl_s=wanted.default_ttl_s,
        executor=ExecutorSettings(cleanup_interval_s=config.cleanup_interval_s),
        head_limits={name: value for name in HEAD_LIMITS if (value := getattr(config, name)) is not None},
        table=rows,
    )


def _source(name: str, config: HubConfig, *, manifest: bool = False, profile: bool = False) -> Source:
    """The source of the row ``name``: a flag over the manifest over the profile over the default."""
    if name in config.flags:
        return Source.FLAG
    if manifest:
        return Source.MANIFEST
    return Source.PROFILE if profile else Source.DEFAULT


def _deployed(name: str, config: HubConfig, *, manifest: bool, profile: bool = False) -> Source:
    """A store setting the deployment applies over the command line's (module docstring)."""
    return Source.MANIFEST if manifest else _source(name, config, profile=profile)


def _shown(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    if isinstance(value, Path):
        return str(value)
    return str(value)


def _listeners(config: HubConfig) -> Iterator[Setting]:
    yield Setting("manifest", str(config.manifest), _source("manifest", config))
    yield Setting("data_dir", str(config.data_dir), _source("data_dir", config))
    for name in _LISTENERS:
        value = getattr(config, name)
        shown = "off" if value is None else _shown(value)
        if name == "wss_port" and value is not None and config.wss_port_optional:
            shown += " where the hub may bind it, else off"
        yield Setting(name, shown, _source(name, config))
    for name in HEAD_LIMITS:
        value = getattr(config, name)
        yield Setting(name, "the head's default" if value is None else _shown(value), _source(name, config))
    lifetime = config.limits.max_token_lifetime_s
    yield Setting(
        "limits.max_token_lifetime_s",
        "no limit" if lifetime is None else _shown(lifetime),
        _source("limits.max_token_lifetime_s", config),
    )


def _profile(config: HubConfig, wanted: DesiredSettings) -> Iterator[Setting]:
    """What the hardware profile sets (the manifest's fsync over it, module docstring)."""
    profile = config.profile
    yield Setting("profile", profile.name, _source("profile", config))
    yield Setting(
        "runtime.event_loop",
        profile.event_loop,
        _source("runtime.event_loop", config, profile="event_loop" in profile.given),
    )
    fsync = wanted.fsync or profile.fsync
    yield Setting(
        "store.fsync",
        _shown(fsync),
        _deployed("store.fsync", config, manifest=wanted.fsync is not None, profile="fsync" in profile.given),
    )
    interval = wanted.fsync_interval_ms or profile.fsync_interval_ms
    yield Setting(
        "store.fsync_interval_ms",
        _shown(interval),
        _deployed(
            "store.fsync_interval_ms",
            config,
            manifest=wanted.fsync_interval_ms is not None,
            profile="fsync_interval_ms" in profile.given,
        ),
    )
    for name in ("max_group", "held_max_bytes"):
        yield Setting(
            f"store.{name}",
            _shown(getattr(profile, name)),
            _source(f"store.{name}", config, profile=name in profile.given),
        )
    for f in fields(RocksTuning):
        value = getattr(profile.rocks, f.name)
        shown = "RocksDB's default" if value is None else _shown(value)
        given = f"rocks.{f.name}" in profile.given
        yield Setting(f"store.rocks.{f.name}", shown, _source(f"store.rocks.{f.name}", config, profile=given))


def _deployed_store(config: HubConfig, wanted: DesiredSettings) -> Iterator[Setting]:
    """The store settings a deployment sets: the TTL, the quota and the cleanup interval."""
    yield Setting(
        "store.default_ttl_s",
        _shown(wanted.default_ttl_s),
        Source.MANIFEST if "storeAndForwardConfiguration.timeToLiveSecs" in wanted.given else Source.DEFAULT,
    )
    quota = wanted.store_quota
    max_bytes = quota.get("max_bytes", config.limits.store_max_bytes)
    yield Setting(
        "store.max_bytes",
        _AUTO_QUOTA if max_bytes == "auto" else _shown(max_bytes),
        _deployed("store.max_bytes", config, manifest="max_bytes" in quota),
    )
    yield Setting(
        "store.max_messages",
        _shown(quota.get("max_messages")),
        Source.MANIFEST if "max_messages" in quota else Source.DEFAULT,
    )
    yield Setting(
        "store.identity_share",
        _shown(quota.get("identity_share", config.limits.identity_share)),
        _deployed("store.identity_share", config, manifest="identity_share" in quota),
    )
    window = wanted.module_window
    yield Setting(
        "delivery.module_window",
        _shown(window or config.module_window),
        _deployed("delivery.module_window", config, manifest=window is not None),
    )
    cleanup = wanted.executor.get("cleanup_interval_s", config.cleanup_interval_s)
    yield Setting(
        "delivery.cleanup_interval_s",
        _shown(cleanup),
        _deployed("delivery.cleanup_interval_s", config, manifest="cleanup_interval_s" in wanted.executor),
    )


def _upstream(config: HubConfig, wanted: DesiredSettings) -> Iterator[Setting]:
    options = upstream_options(wanted.upstream, config)
    for name, key in (
        ("partitions", "partitions"),
        ("duplicate_detection", "duplicateDetection"),
        ("duplicate_window_s", "duplicateDetectionWindowSecs"),
    ):
        given = f"upstream.{key}" in wanted.given
        yield Setting(
            f"upstream.{name}", _shown(getattr(options, name)), _source(f"upstream.{name}", config, manifest=given)
        )
    transport = transport_settings(wanted.upstream, config)
    batch = Setting(
        "upstream.max_batch_messages",
        _shown(transport.max_batch_messages) if transport is not None else "none",
        _source("upstream.max_batch_messages", config, profile=config.profile.max_batch_messages is not None),
    )
    if transport is None:
        yield Setting("upstream.transport", "none ($upstream stays queued)", _source("upstream.transport", config))
    elif isinstance(transport, UploadUpstreamSettings):
        yield Setting("upstream.transport", f"upload {shown_url(transport.url)}", _source("upstream.transport", config))
        yield Setting("upstream.client_id", transport.hub_id, _source("upstream.client_id", config))
        cap_given = wanted.upstream.get("maxUplinkBps") is not None
        yield Setting(
            "upstream.max_uplink_bps",
            _shown(transport.max_uplink_bps),
            _source("upstream.max_uplink_bps", config, manifest=cap_given),
        )
        yield batch
    else:
        yield from _mqtt(config, wanted, transport)
        yield batch
    links = wanted.upstream.get("links")
    if links:  # they replace the transport above (edgehub.runtime.compose.links): its settings are their base
        shown = ", ".join(
            f"{k['name']} ({k.get('address') or shown_url(k.get('url') or '')}, {k['costPerMiB']}/MiB)" for k in links
        )
        yield Setting("upstream.links", shown, Source.MANIFEST)


def _mqtt(config: HubConfig, wanted: DesiredSettings, s: MqttUpstreamSettings) -> Iterator[Setting]:
    where = f"{s.host}:{s.port}" if s.websocket_path is None else f"{s.host}:{s.port}{s.websocket_path} (WebSocket)"
    yield Setting("upstream.transport", f"mqtt {where}", _source("upstream.transport", config))
    yield Setting("upstream.client_id", s.client_id, _source("upstream.client_id", config))
    yield Setting("upstream.protocol", _shown(s.protocol), _source("upstream.protocol", config))
    yield Setting("upstream.username", _shown(s.username), _source("upstream.username", config))
    # Secrets: whether one is set, never the secret itself.
    yield Setting("upstream.password", "set" if s.password else "none", _source("upstream.password", config))
    yield Setting("upstream.sas_token", "set" if s.sas_token else "none", _source("upstream.sas_token", config))
    yield Setting("upstream.tls", "on" if s.tls is not None else "off", _source("upstream.tls", config))
    # the proxy's address only: its credentials are never shown (nor reported in the twin)
    proxy = "none" if s.proxy is None else f"{s.proxy.host}:{s.proxy.port}"
    yield Setting("upstream.proxy", proxy, _source("upstream.proxy", config))
    derived = {"max_batch_bytes": s.segment_bytes, "max_inflight_bytes": s.window_bytes}
    for name, key in LINK_KEYS.items():
        value = getattr(s, name)
        shown = f"{derived[name]} (derived)" if value is None and name in derived else _shown(value)
        manifest = wanted.upstream.get(key) is not None
        yield Setting(f"upstream.{name}", shown, _source(f"upstream.{name}", config, manifest=manifest))
