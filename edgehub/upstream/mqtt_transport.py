"""The MQTT upstream transport: ``$upstream`` as an ``Endpoint`` over MQTT 3.1.1 or 5 to any broker or parent hub.

What it guarantees
------------------
* **The PUBACK is the checkpoint.** Every PUBLISH is QoS 1. ``send`` reports a message as succeeded only when
  the PUBACK for the PUBLISH that carried it has come back on the connection that sent it. A connection that
  drops, or a link that goes silent (no acks, no FIN: paho's keepalive or our ``ack_timeout_s`` notices), fails
  every unacknowledged message of the batch; nothing is reported delivered without its ack. A message may
  arrive twice (a PUBLISH that got through but whose PUBACK was lost); consumers remove duplicates by
  ``edge_message_id`` (segment records) or ``$.mid`` (message mode).
* **Pipelined, and bytes in flight are bounded.** It is a ``PipelinedEndpoint``: the executor ``submit``s
  batches of about ``max_batch_bytes`` wire bytes (``max_batch_messages`` follows the wire bytes per message
  seen so far) while the window ``has_room``, and each batch's PUBACKs settle it, its own checkpoint. A PUBLISH
  is handed to the socket only while the unacknowledged wire bytes plus its own stay within
  ``max_inflight_bytes`` (one PUBLISH larger than the bound goes alone). The window is configured, not
  measured: by default one bandwidth-delay product of the link hints ``link_rate_bps`` x ``link_rtt_s`` plus
  one batch (64 kbit/s, 600 ms: 4,800 + 2,400 bytes). Socket buffers therefore never hold more than one
  window, so a priority-0 message waits behind about one window of lower-priority bytes (at most the window
  plus the batch being handed over when it came): the executor chooses the next batch only when the window has
  room, highest priority first.
* **``max_uplink_bps``**: a token bucket on PUBLISH wire bytes; a backlog after an outage cannot exceed it.
  ``status()`` reports the achieved rate (acknowledged bytes over a 10 s window) and wire bytes per message.
* **Reconnect** runs in its own task (tenacity): exponential backoff with jitter from ``reconnect_min_s`` to
  ``reconnect_max_s`` after a refusal or reset, none after an attempt that hung until ``connect_timeout_s`` (a
  silent link: the next attempt starts at once, so one is always on its way and its CONNECT goes through as
  soon as the link does). ``reconnect_now()`` cuts a backoff short, and every ``submit`` while disconnected
  calls it: the executor's retry and probe schedule (itself cut short by ``on_reachable``) overrides the
  transport's backoff. Each successful CONNACK calls the executor's ``on_reachable``; the loss of that
  connection (a drop, or a silent link noticed by keepalive or ``ack_timeout_s``) calls its ``on_unreachable``,
  which parks the executor's queues until the next CONNACK rather than have it send into a dead link. Every
  connection is a fresh paho client with ``reconnect_on_failure=False``: paho never resends a previous
  connection's PUBLISHes behind our back, so what is in flight is exactly what this module counts.

Wire modes
----------
* ``batch`` (default): one PUBLISH carries one segment (``edgehub.upstream.segment``: record format v2,
  compressed by ``compression``, gzip by default) of one priority, on ``batch_topic`` (default
  ``edgehub/segments/{hub_id}/{lane}/p{priority:02d}``). A ``send``'s batch is cut into segments of at most
  about ``max_batch_bytes`` compressed bytes. On MQTT 5 the PUBLISH also carries content type
  ``application/x-edgehub-segment;v=1;encoding=gzip`` (``encoding=zstd`` for zstd) and user properties
  ``edgehub-segment-version=1`` and ``edgehub-segment-codec``. A zstd segment's topic ends in ``/zstd`` (on
  both MQTT versions), so a subscriber that reads gzip only can leave it out by topic; the bytes themselves
  tell their codec by magic number too. zstd needs the ``zstandard`` package (``edgehub[zstd]``); asking for it
  without the package is refused when the settings are made.
* ``message``: one PUBLISH per message on the IoT Hub telemetry topic
  ``devices/{device_id}/messages/events/{property_bag}`` (``devices/{d}/modules/{m}/...`` when ``module_id``
  is set), the bag holding the application properties URL-encoded and every system property under its bag key
  (``edgehub.core.property_bag``, the table the MQTT head reads bags with: ``$.mid``, ``$.exp``, ``$.schema``,
  ``$.ifid``, ``$.sid``, ``$.pk``, ...).

Authentication: username/password; an IoT Hub SAS token (the password; the username defaults to
``{host}/{client_id}/?api-version=2021-04-12``); TLS with a CA file and optionally a client certificate.

Why paho directly, on its own network thread: paho is already the project's MQTT client; aiomqtt would add a
dependency and its ``publish`` awaits each PUBACK in turn, while this transport needs a window of PUBLISHes
outstanding and the PUBACK of each by packet id. paho's thread calls back through
``loop.call_soon_threadsafe``; every piece of state is touched on the asyncio loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import urllib.parse
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential, wait_random

from edgehub.core import Clock, FailureKind, SystemClock, SystemProperty, TransportError
from edgehub.core.endpoints import UPSTREAM_ENDPOINT, UPSTREAM_LANE
from edgehub.core.mqtt_varint import varint_len
from edgehub.core.property_bag import KEY_OF
from edgehub.delivery.endpoint import QueuedMessage, SendResult
from edgehub.upstream.bandwidth import RateEstimator, TokenBucket, bdp_bytes
from edgehub.upstream.batching import edge_message_id, segment_bytes
from edgehub.upstream.segment import Codec, zstd_available

__all__ = [
    "MqttProtocol",
    "MqttUpstream",
    "MqttUpstreamSettings",
    "TlsSettings",
    "UpstreamStatus",
    "WireMode",
    "publish_wire_bytes",
]

log = logging.getLogger(__name__)

SEGMENT_CONTENT_TYPE = "application/x-edgehub-segment;v=1;encoding={codec}"


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
    keepalive_s: int = 30  # a silent link is noticed within about twice this
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
    compresslevel: int = 6  # gzip 1-9, zstd 1-22
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0

    def __post_init__(self) -> None:
        if (self.max_batch_bytes is not None and self.max_batch_bytes <= 0) or self.max_batch_messages <= 0:
            raise ValueError("max_batch_bytes and max_batch_messages must be positive")
        if self.max_inflight_bytes is not None and self.max_inflight_bytes <= 0:
            raise ValueError("max_inflight_bytes must be positive")
        if self.linger_s < 0 or (self.max_uplink_bps is not None and self.max_uplink_bps <= 0):
            raise ValueError("linger_s must be >= 0 and max_uplink_bps positive")
        if self.compression is Codec.ZSTD and not zstd_available():
            raise ValueError("compression zstd needs the zstandard package: pip install edgehub[zstd]")
        if self.keepalive_s <= 0 or self.ack_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("keepalive_s, ack_timeout_s and connect_timeout_s must be positive")

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


def _publish_properties(user: list[tuple[str, str]], content_type: str | None = None) -> tuple[Properties, int]:
    """MQTT 5 PUBLISH properties and their encoded length (without the length prefix)."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if content_type is not None:
        props.ContentType = content_type
    props.UserProperty = user
    packed: bytes = props.pack()  # type: ignore[no-untyped-call]
    return props, len(packed) - varint_len(len(packed) - 1)


def publish_wire_bytes(topic: str, payload_len: int, *, qos: int = 1, properties_len: int | None = None) -> int:
    """Bytes of a PUBLISH on the wire: fixed header, topic, packet id, MQTT 5 properties, payload."""
    rem = 2 + len(topic.encode()) + (2 if qos else 0) + payload_len
    if properties_len is not None:
        rem += varint_len(properties_len) + properties_len
    return 1 + varint_len(rem) + rem


@dataclass(slots=True)
class _Unit:
    """One PUBLISH and the messages it carries."""

    topic: str
    payload: bytes
    messages: Sequence[QueuedMessage]
    properties: Properties | None
    wire_bytes: int


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[None]
    wire_bytes: int
    sent_at_s: float  # loop time when it was handed to the client


class _Connection:
    """One paho client and its network thread. All state below is touched on the asyncio loop only."""

    def __init__(self, owner: MqttUpstream, client: paho.Client, loop: asyncio.AbstractEventLoop) -> None:
        self.owner = owner
        self.client = client
        self.loop = loop
        self.pending: dict[int, _Pending] = {}
        self.inflight_bytes = 0
        self.alive = False
        self.connack: asyncio.Future[None] = loop.create_future()
        self.lost = asyncio.Event()
        self.lost_reason = ""
        client.on_connect = self._t_on_connect
        client.on_disconnect = self._t_on_disconnect
        client.on_publish = self._t_on_publish

    # paho's thread: hand everything to the loop.
    def _t_on_connect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.loop.call_soon_threadsafe(self._on_connect, bool(rc.is_failure), str(rc))

    def _t_on_disconnect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.loop.call_soon_threadsafe(self._on_lost, f"disconnected: {rc}")

    def _t_on_publish(self, c: paho.Client, u: Any, mid: int, rc: Any, props: Any) -> None:
        self.loop.call_soon_threadsafe(self._on_ack, mid, bool(rc.is_failure), str(rc))

    # the loop.
    def _on_connect(self, failed: bool, reason: str) -> None:
        if self.connack.done():
            return
        if failed:
            self.connack.set_exception(TransportError(f"CONNACK refused: {reason}", kind=FailureKind.PERMANENT))
        else:
            self.alive = True
            self.connack.set_result(None)

    def _on_ack(self, mid: int, failed: bool, reason: str) -> None:
        p = self.pending.pop(mid, None)
        if p is None:
            return
        self.inflight_bytes -= p.wire_bytes
        if not failed:
            self.owner._rtt_samples.append(self.loop.time() - p.sent_at_s)
        if not p.future.done():
            if failed:
                p.future.set_exception(TransportError(f"PUBACK {reason}", kind=FailureKind.PERMANENT))
            else:
                p.future.set_result(None)
        self.owner._window_changed()

    def _on_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.alive = False
        self.lost_reason = reason
        if not self.connack.done():
            self.connack.set_exception(TransportError(f"connection lost before CONNACK: {reason}"))
        for p in self.pending.values():
            if not p.future.done():
                p.future.set_exception(TransportError(f"connection lost before PUBACK: {reason}"))
        self.pending.clear()
        self.inflight_bytes = 0
        self.lost.set()
        self.owner._window_changed()

    def publish(self, unit: _Unit) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self.loop.create_future()
        # A send cancelled mid-way (close, shutdown) leaves futures nobody awaits; their failure is expected.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        info = self.client.publish(unit.topic, unit.payload, qos=1, properties=unit.properties)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            fut.set_exception(TransportError(f"publish refused by client: {paho.error_string(info.rc)}"))
            return fut
        # Registered before the loop runs again, so the PUBACK (delivered via call_soon_threadsafe) finds it.
        self.pending[info.mid] = _Pending(fut, unit.wire_bytes, self.loop.time())
        self.inflight_bytes += unit.wire_bytes
        return fut

    def drop(self, reason: str) -> None:
        """Give up on this connection now (ack timeout, close): fail what is pending, stop the client."""
        self._on_lost(reason)
        with contextlib.suppress(Exception):
            self.client.disconnect()

    async def stop(self) -> None:
        await asyncio.to_thread(self.client.loop_stop)


class MqttUpstream:
    """``$upstream`` over MQTT. ``await start()`` (or ``async with``) before the executor's first send."""

    def __init__(self, settings: MqttUpstreamSettings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self._clock = clock or SystemClock()
        self._on_reachable: Callable[[], None] = lambda: None
        self._on_unreachable: Callable[[], None] = lambda: None
        self._conn: _Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._wake = asyncio.Event()  # cuts a reconnect wait short
        self._window_event = asyncio.Event()
        self._connected_event = asyncio.Event()
        self._bucket = TokenBucket(
            rate_bps=settings.max_uplink_bps, burst_bytes=max(settings.segment_bytes, 1500), clock=self._clock
        )
        self._rate = RateEstimator(clock=self._clock)
        self._connects = 0
        self._peak_inflight = 0
        self._messages_acked = 0
        self._publishes_acked = 0
        self._wire_acked = 0
        self._bytes_per_message: float | None = None
        self._rtt_samples: deque[float] = deque(maxlen=64)

    # -- Endpoint ---------------------------------------------------------------------------------------------

    @property
    def endpoint_id(self) -> str:
        return self.settings.endpoint_id

    @property
    def max_batch_messages(self) -> int:
        """About ``max_batch_bytes`` worth of messages, learnt from the wire bytes per message of the batches
        sent so far (one message until the first batch tells), at most ``settings.max_batch_messages``."""
        if self._bytes_per_message is None:
            return 1
        fit = int(self.settings.segment_bytes / self._bytes_per_message)
        return max(1, min(self.settings.max_batch_messages, fit))

    def _learn_size(self, messages: int, wire_bytes: int) -> None:
        """Keep a moving average of wire bytes per message (weighted by the batch's size)."""
        sample = wire_bytes / messages
        if self._bytes_per_message is None:
            self._bytes_per_message = sample
        else:
            weight = min(0.5, messages / max(1, self.max_batch_messages) / 2)
            self._bytes_per_message += weight * (sample - self._bytes_per_message)

    @property
    def linger_s(self) -> float:
        return self.settings.linger_s

    @property
    def max_batch_bytes(self) -> int:
        return self.settings.segment_bytes

    def bind(self, on_reachable: Callable[[], None]) -> None:
        self._on_reachable = on_reachable

    def bind_unreachable(self, on_unreachable: Callable[[], None]) -> None:
        self._on_unreachable = on_unreachable

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._connection_loop(), name=f"upstream.mqtt.{self.settings.lane}")

    async def __aenter__(self) -> MqttUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.drop("closed")
            await conn.stop()

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.alive

    async def wait_connected(self) -> None:
        """Return once a connection is up. Bound it with ``asyncio.timeout``."""
        while not self.connected:
            self._connected_event.clear()
            await self._connected_event.wait()

    def reconnect_now(self) -> None:
        """Cut a reconnect backoff short (the executor learned the link is back some other way)."""
        self._wake.set()

    def set_max_uplink_bps(self, rate_bps: float | None) -> None:
        self._bucket.set_rate(rate_bps)

    def status(self) -> UpstreamStatus:
        conn = self._conn
        return UpstreamStatus(
            connected=self.connected,
            connects=self._connects,
            inflight_bytes=conn.inflight_bytes if conn is not None else 0,
            peak_inflight_bytes=self._peak_inflight,
            window_bytes=self.settings.window_bytes,
            achieved_bps=self._rate.rate_bps(),
            messages_acked=self._messages_acked,
            publishes_acked=self._publishes_acked,
            wire_bytes_acked=self._wire_acked,
            wire_bytes_per_message=self._wire_acked / self._messages_acked if self._messages_acked else 0.0,
            rtt_min_s=min(self._rtt_samples, default=None),
        )

    async def send(self, batch: Sequence[QueuedMessage]) -> SendResult:
        """Deliver ``batch`` and wait for every PUBACK (``submit``, then its result)."""
        return await (await self.submit(batch))

    @property
    def has_room(self) -> bool:
        """One more batch of ``max_batch_bytes`` fits the window (or nothing is in flight, or no connection)."""
        conn = self._conn
        if conn is None or not conn.alive or conn.inflight_bytes == 0:
            return True
        return conn.inflight_bytes + self.settings.segment_bytes <= self.settings.window_bytes

    async def submit(self, batch: Sequence[QueuedMessage]) -> asyncio.Future[SendResult]:
        """Publish ``batch`` (waiting for window room and the uplink budget as needed) and return once every
        PUBLISH of it is handed to the client; the future resolves once their PUBACKs are in (or failed)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[SendResult] = loop.create_future()
        if not batch:
            done.set_result(SendResult())
            return done
        conn = self._conn
        if conn is None or not conn.alive:
            self.reconnect_now()  # the executor wants to send: a reconnect backoff need not run its course
            done.set_result(SendResult.all_failed(batch, FailureKind.TRANSIENT, "upstream not connected"))
            return done
        try:
            units = self._units(batch)
        except Exception as exc:  # an encoding failure is this batch's, not the link's
            log.exception("upstream.encode_failed lane=%s", self.settings.lane)
            done.set_result(SendResult(invalid=tuple(batch), failure_kind=FailureKind.INVALID_INPUT, error=repr(exc)))
            return done
        self._learn_size(len(batch), sum(u.wire_bytes for u in units))
        sent: list[tuple[_Unit, asyncio.Future[None]]] = []
        for unit in units:
            if not await self._wait_window(conn, unit.wire_bytes):
                break
            await self._bucket.take(unit.wire_bytes)
            if not conn.alive:
                break
            sent.append((unit, conn.publish(unit)))
            self._peak_inflight = max(self._peak_inflight, conn.inflight_bytes)
        return asyncio.ensure_future(self._collect(conn, units, sent))

    # -- internals --------------------------------------------------------------------------------------------

    def _window_changed(self) -> None:
        self._window_event.set()

    async def _wait_window(self, conn: _Connection, size: int) -> bool:
        window = self.settings.window_bytes
        while conn.alive and conn.inflight_bytes > 0 and conn.inflight_bytes + size > window:
            self._window_event.clear()
            await self._window_event.wait()
        return conn.alive

    async def _collect(
        self, conn: _Connection, units: list[_Unit], sent: list[tuple[_Unit, asyncio.Future[None]]]
    ) -> SendResult:
        succeeded: list[QueuedMessage] = []
        failed: list[QueuedMessage] = []
        invalid: list[QueuedMessage] = []
        kind: FailureKind | None = None
        error: str | None = None
        deadline = asyncio.get_running_loop().time() + self.settings.ack_timeout_s
        wire = 0
        for unit, fut in sent:
            try:
                async with asyncio.timeout_at(deadline):
                    await asyncio.shield(fut)
            except TimeoutError:
                conn.drop(f"no PUBACK within {self.settings.ack_timeout_s}s")
                kind, error = FailureKind.TIMEOUT, f"no PUBACK within {self.settings.ack_timeout_s}s"
                failed.extend(unit.messages)
                continue
            except TransportError as exc:
                if exc.kind is FailureKind.PERMANENT:
                    invalid.extend(unit.messages)
                else:
                    failed.extend(unit.messages)
                kind, error = kind or exc.kind, error or str(exc)
                continue
            succeeded.extend(unit.messages)
            wire += unit.wire_bytes
            self._rate.record(unit.wire_bytes)
            self._publishes_acked += 1
        unsent = units[len(sent) :]
        for unit in unsent:
            failed.extend(unit.messages)
        if unsent and kind is None:
            kind, error = FailureKind.TRANSIENT, f"connection lost: {conn.lost_reason}"
        self._messages_acked += len(succeeded)
        self._wire_acked += wire
        details = {"publishes": str(len(units)), "wire_bytes": str(wire)}
        if succeeded:
            details["wire_bytes_per_msg"] = f"{wire / len(succeeded):.1f}"
        if failed or invalid:
            log.info(
                "upstream.send_failed lane=%s acked=%d failed=%d invalid=%d kind=%s error=%s",
                self.settings.lane, len(succeeded), len(failed), len(invalid), kind, error,
            )  # fmt: skip
        return SendResult(
            succeeded=tuple(succeeded),
            failed=tuple(failed),
            invalid=tuple(invalid),
            failure_kind=kind,
            error=error,
            details=details,
        )

    def _edge_id(self, qm: QueuedMessage) -> str:
        return edge_message_id(qm, hub_id=self.settings.hub_id, lane=self.settings.lane)

    def _segment_payload(self, msgs: Sequence[QueuedMessage]) -> bytes:
        s = self.settings
        return segment_bytes(msgs, hub_id=s.hub_id, lane=s.lane, compresslevel=s.compresslevel, codec=s.compression)

    def _units(self, batch: Sequence[QueuedMessage]) -> list[_Unit]:
        if self.settings.wire_mode is WireMode.MESSAGE:
            return [self._message_unit(qm) for qm in batch]
        return self._segment_units(batch)

    def _segment_units(self, batch: Sequence[QueuedMessage]) -> list[_Unit]:
        s = self.settings
        topic = s.batch_topic.format(hub_id=s.hub_id, lane=s.lane, priority=batch[0].priority)
        if s.compression is Codec.ZSTD:
            topic += "/zstd"
        props: Properties | None = None
        props_len: int | None = None
        if s.protocol is MqttProtocol.V5:
            props, props_len = _publish_properties(
                [("edgehub-segment-version", "1"), ("edgehub-segment-codec", str(s.compression))],
                SEGMENT_CONTENT_TYPE.format(codec=s.compression),
            )
        # Cut into runs whose compressed size is about max_batch_bytes: halve a run until it fits (or is one
        # message), so compression still sees as many messages as fit.
        units: list[_Unit] = []
        stack: list[Sequence[QueuedMessage]] = [batch]
        while stack:
            run = stack.pop()
            payload = self._segment_payload(run)
            if len(payload) > s.segment_bytes and len(run) > 1:
                mid = len(run) // 2
                stack.append(run[mid:])
                stack.append(run[:mid])
                continue
            wire = publish_wire_bytes(topic, len(payload), properties_len=props_len)
            units.append(_Unit(topic, payload, run, props, wire))
        return units

    def _message_unit(self, qm: QueuedMessage) -> _Unit:
        s = self.settings
        m = qm.message
        device = s.device_id or s.client_id.split("/")[0]
        base = f"devices/{device}/modules/{s.module_id}" if s.module_id else f"devices/{device}"
        bag: list[tuple[str, str]] = []
        for k, v in m.properties.items():
            bag.append((k, v if v is not None else ""))
        for name, short in KEY_OF.items():
            value = m.system_properties.get(name)
            if value is not None:
                bag.append((short, value))
        if SystemProperty.MESSAGE_ID not in m.system_properties:
            bag.append(("$.mid", self._edge_id(qm)))
        topic = f"{base}/messages/events/{urllib.parse.urlencode(bag, quote_via=urllib.parse.quote)}"
        props_len: int | None = None
        props: Properties | None = None
        if s.protocol is MqttProtocol.V5:
            props, props_len = _publish_properties(bag)
            topic = f"{base}/messages/events/"
        return _Unit(topic, m.body, (qm,), props, publish_wire_bytes(topic, len(m.body), properties_len=props_len))

    # -- connection -------------------------------------------------------------------------------------------

    def _new_client(self) -> paho.Client:
        s = self.settings
        v5 = s.protocol is MqttProtocol.V5
        client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=s.client_id,
            clean_session=None if v5 else True,
            protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
            reconnect_on_failure=False,  # one connection per client: see the module docstring
        )
        client.connect_timeout = s.connect_timeout_s
        client.max_inflight_messages_set(0)  # 0: no count limit; the byte window is the bound
        client.max_queued_messages_set(0)
        password = s.sas_token or s.password
        username = s.username
        if s.sas_token and username is None:
            username = f"{s.host}/{s.client_id}/?api-version=2021-04-12"
        if username is not None or password is not None:
            client.username_pw_set(username, password)
        if s.tls is not None:
            ctx = ssl.create_default_context(cafile=s.tls.ca_certs)
            ctx.check_hostname = s.tls.check_hostname
            if s.tls.certfile:
                ctx.load_cert_chain(s.tls.certfile, s.tls.keyfile)
            client.tls_set_context(ctx)
        return client

    async def _connect_once(self) -> _Connection:
        s = self.settings
        loop = asyncio.get_running_loop()
        client = self._new_client()
        conn = _Connection(self, client, loop)
        try:
            await asyncio.to_thread(client.connect, s.host, s.port, s.keepalive_s)
        except (OSError, ssl.SSLError, ValueError) as exc:
            kind = FailureKind.TIMEOUT if isinstance(exc, TimeoutError) else FailureKind.TRANSIENT  # a silent link
            raise TransportError(f"connect to {s.host}:{s.port} failed: {exc!r}", kind=kind) from exc
        client.loop_start()
        try:
            async with asyncio.timeout(s.connect_timeout_s):
                await conn.connack
        except (TimeoutError, TransportError) as exc:
            conn.drop(f"no CONNACK: {exc!r}")
            await conn.stop()
            if isinstance(exc, TransportError):
                raise
            raise TransportError(
                f"no CONNACK from {s.host}:{s.port} within {s.connect_timeout_s}s", kind=FailureKind.TIMEOUT
            ) from exc
        return conn

    async def _backoff_sleep(self, delay_s: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self._wake.wait()

    def _log_connect_failed(self, rs: RetryCallState) -> None:
        error = rs.outcome.exception() if rs.outcome is not None else None
        log.info("upstream.connect_failed lane=%s attempt=%d error=%s", self.settings.lane, rs.attempt_number, error)

    def _reconnect_wait(self, rs: RetryCallState) -> float:
        """Exponential backoff with jitter after a refusal or a reset; none after an attempt that hung until
        ``connect_timeout_s``: it paced the loop already, and while the link is silent the attempt on its way is
        the one that hears first when the link comes back (its CONNECT goes through, the CONNACK follows)."""
        error = rs.outcome.exception() if rs.outcome is not None else None
        if isinstance(error, TransportError) and error.kind is FailureKind.TIMEOUT:
            return 0.0
        backoff = wait_exponential(multiplier=self.settings.reconnect_min_s, max=self.settings.reconnect_max_s)
        return float(backoff(rs)) + float(wait_random(0, self.settings.reconnect_min_s)(rs))

    async def _connection_loop(self) -> None:
        s = self.settings
        while not self._closed:
            retrying = AsyncRetrying(
                wait=self._reconnect_wait,
                retry=retry_if_exception_type(TransportError),
                sleep=self._backoff_sleep,
                before_sleep=self._log_connect_failed,
                reraise=True,
            )
            conn: _Connection | None = None
            async for attempt in retrying:
                with attempt:
                    conn = await self._connect_once()
            assert conn is not None
            self._conn = conn
            self._connects += 1
            self._connected_event.set()
            log.info("upstream.connected lane=%s host=%s port=%d connects=%d", s.lane, s.host, s.port, self._connects)
            self._on_reachable()
            await conn.lost.wait()
            log.info("upstream.lost lane=%s reason=%s", s.lane, conn.lost_reason)
            self._on_unreachable()
            await conn.stop()
