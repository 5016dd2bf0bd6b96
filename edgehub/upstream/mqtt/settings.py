"""The MQTT upstream's settings and status values: what is configured, and what ``status()`` reports.

Invariants: settings are checked when they are made (a bad value raises ``ValueError`` there, never later on
the link), and the window and batch sizes are derived from them in one place (``window_bytes``,
``segment_bytes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from edgehub.core.endpoints import UPSTREAM_ENDPOINT, UPSTREAM_LANE
from edgehub.upstream.bandwidth import bdp_bytes
from edgehub.upstream.reconnect import DEFAULT_SCHEDULE
from edgehub.upstream.segment import Codec, zstd_available

__all__ = [
    "MAX_SESSION_EXPIRY_S",
    "MqttProtocol",
    "MqttUpstreamSettings",
    "ProxySettings",
    "TlsSettings",
    "UpstreamStatus",
    "WireMode",
]


MIN_PACKET_BYTES = 1024  # a twin document or a method call must fit
MAX_PACKET_BYTES = 268_435_460  # MQTT's own limit: a four-byte remaining length and its header
MAX_SESSION_EXPIRY_S = 30 * 86_400  # a broker keeps a session of ours (and what it queued for it) at most a month


class WireMode(StrEnum):
    BATCH = "batch"
    MESSAGE = "message"


class MqttProtocol(StrEnum):
    V311 = "3.1.1"
    V5 = "5"


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """TLS to the broker. ``ca_certs`` None: the system's trust store."""

    ca_certs: str | None = None
    certfile: str | None = None  # client certificate (X.509 authentication)
    keyfile: str | None = None
    check_hostname: bool = True


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """An HTTP proxy that takes ``CONNECT host:port`` (tinyproxy, Squid, a site's). ``username``/``password``:
    Basic credentials, when it asks for them (never shown: ``repr`` leaves them out)."""

    host: str
    port: int
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.host or not 0 < self.port < 65536:
            raise ValueError(f"a proxy needs a host and a port 1-65535, not {self.host!r}:{self.port}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MqttUpstreamSettings:
    """Every knob of the MQTT upstream. Units are in the names."""

    host: str
    port: int = 1883
    client_id: str  # the MQTT client id; in IoT Hub terms the hub's device id (or "device/module")
    hub_id: str  # goes into segment records and topics
    device_id: str | None = None  # message mode's topic device; default: client_id before any "/"
    module_id: str | None = None  # message mode's topic module, when the hub sends as a module
    lane: str = UPSTREAM_LANE  # "upstream", or "upstream-p3" for partition 3 (edgehub.core.endpoints.lane_name)
    endpoint_id: str = UPSTREAM_ENDPOINT
    wire_mode: WireMode = WireMode.BATCH
    protocol: MqttProtocol = MqttProtocol.V311
    batch_topic: str = "edgehub/segments/{hub_id}/{lane}/p{priority:02d}"
    username: str | None = None
    password: str | None = None
    sas_token: str | None = None  # when set, it is the password (IoT Hub style)
    tls: TlsSettings | None = None
    # MQTT over a WebSocket to this path on host:port (subprotocol mqtt; with ``tls``, wss://), for brokers and
    # sites that take only HTTP(S): "/mqtt" for Mosquitto's websockets listener, "/$iothub/websocket" for IoT Hub.
    # None: MQTT over TCP. (edgehub.upstream.mqtt.stream)
    websocket_path: str | None = None
    # An HTTP proxy to reach host:port through (CONNECT), for sites where only the proxy leaves. None: direct.
    proxy: ProxySettings | None = None
    keepalive_s: int = 30  # a silent link is noticed within this (awaiting an answer) or 1.5x (idle)
    connect_timeout_s: float = 10.0  # TCP + TLS + CONNACK
    ack_timeout_s: float = 30.0  # a PUBACK later than this fails its messages and drops the connection
    link_rate_bps: float = 64_000.0  # link hints for the default window
    link_rtt_s: float = 0.6
    max_inflight_bytes: int | None = None  # None: one bandwidth-delay product of the hints plus one batch
    max_uplink_bps: float | None = None  # maxUplinkBps: cap on PUBLISH wire bytes; None = no cap
    max_batch_bytes: int | None = None  # wire bytes per batch and per segment; None: half a BDP (1-64 KiB)
    max_batch_messages: int = 1000  # the most messages in one batch, whatever their size
    linger_s: float = 0.2  # while batches are in flight, how long a short batch waits to fill
    compression: Codec = Codec.GZIP  # batch mode's segment codec; zstd needs the zstandard package
    # zstd only: train a dictionary per lane and compress with it once the far side has it (upstream.dictionary)
    zstd_dictionary: bool = True
    dictionary_topic: str = "edgehub/segments/{hub_id}/{lane}/dict"
    # gzip 1-9, zstd 1-22; None: the codec's own, gzip 6 and zstd 19 (on a thin link bytes cost more than CPU;
    # zstd segments are compressed off the event loop)
    compresslevel: int | None = None
    # Connect attempts (edgehub.upstream.reconnect): refused or reset at once, the next after this steady
    # interval (+ up to 50 % jitter); refused by the far side (CONNACK), a backoff doubling from
    # reconnect_refused_min_s up to reconnect_max_s.
    reconnect_min_s: float = DEFAULT_SCHEDULE.interval_s
    reconnect_max_s: float = DEFAULT_SCHEDULE.refused_max_s
    reconnect_refused_min_s: float = DEFAULT_SCHEDULE.refused_min_s
    max_cloud_devices: int = 1000  # devices subscribed for (device-bound messages, method calls); see cloud
    # How long the broker keeps this client's session (its subscriptions and the QoS 1 device-bound messages that
    # came while the hub was away) after a connection is lost: MQTT 5's session expiry interval; on 3.1.1 any
    # value but 0 is clean_session=False (the broker's own expiry applies). 0: a clean session on every connection.
    session_expiry_s: int = 86_400
    # The largest packet taken from the broker (fixed header included); MQTT 5 announces it in CONNECT, so the
    # broker drops a larger message rather than send it. A larger packet, or bytes that are no MQTT, lose the
    # connection (logged), and what the connection had in flight fails as with any loss.
    max_packet_bytes: int = 1024 * 1024
    # The largest packet the broker takes from us, for a broker that does not announce it (MQTT 3.1.1 never does;
    # Azure IoT Hub takes messages of up to 256 KB). An MQTT 5 broker's Maximum Packet Size applies too; the smaller
    # wins. None: no limit but the broker's own announcement.
    broker_max_packet_bytes: int | None = None

    def __post_init__(self) -> None:
        if (self.max_batch_bytes is not None and self.max_batch_bytes <= 0) or self.max_batch_messages <= 0:
            raise ValueError("max_batch_bytes and max_batch_messages must be positive")
        if self.max_inflight_bytes is not None and self.max_inflight_bytes <= 0:
            raise ValueError("max_inflight_bytes must be positive")
        if self.linger_s < 0 or (self.max_uplink_bps is not None and self.max_uplink_bps <= 0):
            raise ValueError("linger_s must be >= 0 and max_uplink_bps positive")
        top = 22 if self.compression is Codec.ZSTD else 9
        if self.compresslevel is not None and not 1 <= self.compresslevel <= top:
            raise ValueError(f"compresslevel must be 1-{top} for {self.compression}")
        if self.compression is Codec.ZSTD and not zstd_available():
            raise ValueError("compression zstd needs the zstandard package: pip install edgehub[zstd]")
        if not 0 <= self.session_expiry_s <= MAX_SESSION_EXPIRY_S:
            raise ValueError(f"session_expiry_s must be 0-{MAX_SESSION_EXPIRY_S}")
        if self.max_cloud_devices < 0:
            raise ValueError("max_cloud_devices must be >= 0")
        if min(self.reconnect_min_s, self.reconnect_max_s, self.reconnect_refused_min_s) <= 0:
            raise ValueError("reconnect_min_s, reconnect_max_s and reconnect_refused_min_s must be positive")
        for name in ("max_packet_bytes", "broker_max_packet_bytes"):
            value = getattr(self, name)
            if value is not None and not MIN_PACKET_BYTES <= value <= MAX_PACKET_BYTES:
                raise ValueError(f"{name} must be {MIN_PACKET_BYTES}-{MAX_PACKET_BYTES}")
        if self.websocket_path is not None and not self.websocket_path.startswith("/"):
            raise ValueError(f"websocket_path must start with '/', not {self.websocket_path!r}")
        if self.keepalive_s <= 0 or self.ack_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("keepalive_s, ack_timeout_s and connect_timeout_s must be positive")

    @property
    def level(self) -> int:
        """The compression level segments are made with."""
        if self.compresslevel is not None:
            return self.compresslevel
        return 19 if self.compression is Codec.ZSTD else 6

    @property
    def window_bytes(self) -> int:
        """The bound on unacknowledged PUBLISH bytes: one bandwidth-delay product keeps the link busy while the
        acks travel back, and one batch more covers the time that batch takes to serialise before it can be
        acknowledged."""
        if self.max_inflight_bytes is not None:
            return self.max_inflight_bytes
        return bdp_bytes(self.link_rate_bps, self.link_rtt_s) + self.segment_bytes

    @property
    def segment_bytes(self) -> int:
        """Wire bytes of one batch (and of one segment): half a bandwidth-delay product, so two or more are on
        their way at once, within 1 KiB (smaller compresses badly) and 64 KiB; at most half an explicit window."""
        if self.max_batch_bytes is not None:
            return self.max_batch_bytes
        size = min(65_536, max(1024, bdp_bytes(self.link_rate_bps, self.link_rtt_s) // 2))
        if self.max_inflight_bytes is not None:
            size = min(size, max(512, self.max_inflight_bytes // 2))
        return size


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """What ``status()`` reports for one lane."""

    connected: bool
    connects: int  # successful CONNACKs so far
    inflight_bytes: int
    peak_inflight_bytes: int
    window_bytes: int
    achieved_bps: float
    messages_acked: int
    publishes_acked: int
    wire_bytes_acked: int
    wire_bytes_per_message: float  # PUBLISH bytes (fixed header to payload) per acknowledged message
    # The least PUBLISH-to-PUBACK time of the last 64 acks (a PUBLISH that went out with little ahead of it takes
    # about one round trip plus its own serialisation); None before the first ack. With ``achieved_bps`` it tells
    # whether the window fits the link: the configured window is not changed by it.
    rtt_min_s: float | None = None
    offline_count: int = 0  # established connections lost
    offline_s: float = 0.0  # from each loss to the next connect, summed over the outages that ended
    offline_ended: int = 0  # outages that ended (a loss followed by a connect)

    @classmethod
    def summed(cls, statuses: Sequence[UpstreamStatus], *, connected: bool) -> UpstreamStatus:
        """Several transports' statuses as one (a lane's links, a hub's lanes): counts, rates and outages summed,
        the peak the largest, the round trip the least; whether it is connected is the caller's to say."""
        acked = sum(s.messages_acked for s in statuses)
        wire = sum(s.wire_bytes_acked for s in statuses)
        return cls(
            connected=connected,
            connects=sum(s.connects for s in statuses),
            inflight_bytes=sum(s.inflight_bytes for s in statuses),
            peak_inflight_bytes=max((s.peak_inflight_bytes for s in statuses), default=0),
            window_bytes=sum(s.window_bytes for s in statuses),
            achieved_bps=sum(s.achieved_bps for s in statuses),
            messages_acked=acked,
            publishes_acked=sum(s.publishes_acked for s in statuses),
            wire_bytes_acked=wire,
            wire_bytes_per_message=wire / acked if acked else 0.0,
            rtt_min_s=min((s.rtt_min_s for s in statuses if s.rtt_min_s is not None), default=None),
            offline_count=sum(s.offline_count for s in statuses),
            offline_s=sum(s.offline_s for s in statuses),
            offline_ended=sum(s.offline_ended for s in statuses),
        )
