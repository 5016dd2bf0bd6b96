"""From the settings to the upstream transports: the options of the lanes (partitions, duplicate detection), the
transport settings with the profile's, the manifest's and the command line's link settings applied in that order,
and one transport per lane (MQTT or upload), the lanes the store still holds messages for included.

Invariants: a lane the store holds undelivered messages for always gets a transport, so nothing stays queued for a
lane the partition count no longer names; credentials and TLS come from the command line only, never the
manifest; a setting the transport refuses (zstd without its package) is a ``ConfigurationError`` before the start.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from edgehub.core import ConfigurationError, TransportError
from edgehub.core.endpoints import (
    is_upstream_endpoint,
    lane_name_of,
    parse_upstream_lane_id,
    upstream_lane_id,
)
from edgehub.hub.lanes import UpstreamOptions
from edgehub.runtime.compose.config import HubConfig, UploadUpstreamSettings
from edgehub.store import Store
from edgehub.upstream.dictionary import DictionaryKeeper, LaneDictionary
from edgehub.upstream.landing import LandingZone
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, WireMode
from edgehub.upstream.s3env import s3_environment_problem
from edgehub.upstream.segment import Codec
from edgehub.upstream.upload_transport import UploadTransport

__all__ = [
    "LINK_KEYS",
    "landing_zone",
    "lane_ids",
    "lane_settings",
    "transport_settings",
    "upload_dictionary_lane",
    "upload_lane",
    "upstream_options",
]

log = logging.getLogger(__name__)

# The MQTT transport's link settings (``UpstreamOverrides``' fields), each with the manifest's upstream key that
# sets it: one list for the transport and for ``edgehub config show``.
LINK_KEYS = {
    "wire_mode": "wireMode",
    "max_uplink_bps": "maxUplinkBps",
    "max_batch_bytes": "maxBatchBytes",
    "linger_s": "lingerMs",
    "max_inflight_bytes": "maxInflightBytes",
    "link_rate_bps": "linkRateBps",
    "link_rtt_s": "linkRttMs",
    "compression": "compression",
    "max_packet_bytes": "maxPacketBytes",
    "broker_max_packet_bytes": "brokerMaxPacketBytes",
}


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
    profile's batch size, ``maxUplinkBps`` and ``compression`` only."""
    if config.upstream is None:
        return None
    base = config.upstream
    if config.profile.max_batch_messages is not None:
        base = replace(base, max_batch_messages=config.profile.max_batch_messages)
    cap_bps = up.get("maxUplinkBps")
    if isinstance(base, UploadUpstreamSettings):
        cap = config.upstream_overrides.max_uplink_bps or (float(cap_bps) if cap_bps else None)
        if cap is not None:
            base = replace(base, max_uplink_bps=cap)
        codec = config.upstream_overrides.compression or up.get("compression")
        return replace(base, compression=Codec(codec)) if codec is not None else base
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
    cli: dict[str, object] = {name: getattr(o, name) for name in LINK_KEYS}
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
    installed (``s3://`` without s3fs), or, for ``s3://``, when the AWS environment is one every write would fail in
    (``s3_environment_problem``: an endpoint that is no URL, a profile the files do not hold)."""
    try:
        zone = LandingZone(url)
    except TransportError as exc:
        raise ConfigurationError(f"upstream upload: {exc}") from exc
    problem = s3_environment_problem() if url.startswith(("s3://", "s3a://")) else None
    if problem is not None:
        raise ConfigurationError(f"upstream upload {zone.shown_url}: {problem}")
    return zone


def upload_lane(
    settings: UploadUpstreamSettings,
    lane_id: str,
    *,
    keeper: DictionaryKeeper | None = None,
    dictionary: LaneDictionary | None = None,
    side: str | None = None,
) -> UploadTransport:
    """The upload transport of one lane: ``$upstream`` writes lane ``upstream``, ``$upstream/{i}`` lane
    ``upstream-p{i}``, each through its own ``LandingZone`` on ``settings.url``. With zstd, each lane trains its
    own dictionary, kept through ``keeper`` (the store) under the lane's name with ``upload-`` before it, apart from
    an MQTT lane's of the same name (which the far side has by another road); or uses ``dictionary``, the lane's
    that its other links share, this landing zone being its far side ``side``."""
    if not is_upstream_endpoint(lane_id):
        raise ValueError(f"{lane_id!r} is not an upstream lane")
    lane = lane_name_of(parse_upstream_lane_id(lane_id))
    if settings.compression is not Codec.ZSTD:
        dictionary = None
    elif dictionary is None:
        dictionary = LaneDictionary(lane=upload_dictionary_lane(lane_id), keeper=keeper)
    try:
        return _upload_transport(settings, lane, lane_id, dictionary, side)
    except ValueError as exc:  # zstd without the zstandard package
        raise ConfigurationError(f"upstream upload: {exc}") from exc


def upload_dictionary_lane(lane_id: str) -> str:
    """The name the dictionary of upload lane ``lane_id`` is kept under (the store's ``upstream/zdict/{name}``)."""
    return f"upload-{lane_name_of(parse_upstream_lane_id(lane_id))}"


def _upload_transport(
    settings: UploadUpstreamSettings, lane: str, lane_id: str, dictionary: LaneDictionary | None, side: str | None
) -> UploadTransport:
    return UploadTransport(
        landing_zone(settings.url),
        hub_id=settings.hub_id,
        lane=lane,
        endpoint_id=lane_id,
        max_uplink_bps=settings.max_uplink_bps,
        max_batch_messages=settings.max_batch_messages,
        codec=settings.compression,
        dictionary=dictionary,
        dictionary_side=side,
    )


def lane_ids(store: Store, options: UpstreamOptions) -> list[str]:
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
