"""One MQTT connection of the upstream to its broker: an asyncio ``Protocol`` driving the codec's client side
(``edgehub.mqtt.client``), and the PUBLISHes it has in flight.

Everything runs on the event loop: no thread, no callback hopping between threads. ``open_connection`` makes the TCP
(and TLS) connection, or the way through a proxy and over a WebSocket (``stream.dial``), and waits for the CONNACK,
all within ``connect_timeout_s``.

Invariants: every connection is new (nothing is resent from a previous one), so what is in flight is exactly what
``Connection`` counts; ``inflight_bytes`` is the sum of the wire bytes of the PUBLISHes awaiting their PUBACK; once
the connection is lost, every pending PUBLISH has failed and nothing more is acknowledged or sent on it. Packet ids
are 1-65535, never one still awaiting its PUBACK or SUBACK. The broker's PUBLISHes to us (device-bound messages,
method calls: ``cloud``) are acknowledged by us (``ack``), once handled. A silent link is noticed: a PINGREQ goes
out when we sent nothing for ``keepalive_s``; a connection awaiting an answer (a PUBACK, SUBACK or PINGRESP) is lost
once it heard nothing from the broker for ``keepalive_s`` and its question has waited half of that, and any
connection that heard nothing for 1.5 x ``keepalive_s`` (MQTT's own bound) is lost. Under traffic an answer is
always awaited, so a silence is noticed at most one keepalive after it began (the last thing heard came before it);
an idle connection's PINGREQ makes it 1.5. A link that is merely slow answers well within a keepalive (a segment is
half a bandwidth-delay product, so PUBACKs come about every half round trip), and a question after a quiet spell
gets half a keepalive for its round trip. Bytes from the broker that are no MQTT, or a packet over
``max_packet_bytes``, lose the connection with the reason logged (``RefusalLog``), never a traceback. No task or
descriptor outlives a connection: ``stop`` returns once the socket is closed.

The other way, what an MQTT 5 broker's CONNACK announces is kept. Our QoS 1 PUBLISHes awaiting their PUBACK are
never more than its Receive Maximum: ``batch_slot_free`` says whether one more batch PUBLISH may go (one slot is
left to the reports ``publish`` sends at QoS 1, unless the maximum is 1), and a report that finds no slot is held
(at most ``_MAX_HELD``, the oldest dropped first) and written when a PUBACK frees one, before any further batch
PUBLISH. A PUBLISH over ``max_packet_out`` (the broker's Maximum Packet Size, or ``broker_max_packet_bytes`` for a
broker that announces none, the smaller of the two) is never written (``publish_unit`` fails it PERMANENT;
``publish`` drops it, a refusal logged).

The session outlives the connection (``session_expiry_s``, 1 day by default: MQTT 3.1.1 clean_session=False, MQTT
5 clean_start=False with that session expiry interval), so the broker keeps our subscriptions and queues the QoS 1
device-bound messages that come while the hub is away, and sends again those it sent but we had not acknowledged.
It does not make our own PUBLISHes survive a connection: the broker keeps no state for QoS 1 PUBLISHes it
received, and we never resend a previous connection's PUBLISHes. A PUBLISH whose PUBACK was lost is therefore
failed to the executor and sent again in a later batch, as with a clean session; receivers remove the duplicate
(``edge_message_id``, ``$.mid``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from dataclasses import dataclass
from typing import Protocol, cast

from edgehub.core import FailureKind, RemoteProtocolError, TransportError
from edgehub.core.logtext import shown
from edgehub.core.refusals import RefusalLog, RefusalReason
from edgehub.mqtt.client import (
    TOO_LARGE,
    BrokerDecoder,
    BrokerPacket,
    ConnAckIn,
    DisconnectIn,
    PacketIds,
    PubAckIn,
    PublishIn,
    SkippedPublishIn,
    SubAckIn,
    connect_packet,
    disconnect_packet,
    pingreq_packet,
    puback_packet,
    publish_packet,
    subscribe_packet,
)
from edgehub.upstream.mqtt.cloud import CloudMessage
from edgehub.upstream.mqtt.settings import MqttProtocol, MqttUpstreamSettings
from edgehub.upstream.mqtt.wire import Unit

__all__ = ["Connection", "Owner", "open_connection"]

log = logging.getLogger(__name__)
_CLOSE_GRACE_S = 2.0  # a closing socket (TLS close_notify, a last DISCONNECT) gets this long, then it is aborted
_CONNACK_REFUSALS = {1: "unacceptable protocol version", 2: "identifier rejected", 3: "server unavailable"}
_CONNACK_REFUSALS |= {4: "bad user name or password", 5: "not authorized"}
_MQTT_RECEIVE_MAXIMUM = 65_535  # MQTT 5's default when the CONNACK names none
_MAX_HELD = 16  # QoS 1 reports waiting for a Receive Maximum slot (one twin report per change of reported state)
# PUBACK reason codes that say "not now" rather than "never" (MQTT 5, 3.4.2.1): the messages are sent again.
_PUBACK_TRANSIENT = frozenset({0x80, 0x83, 0x91, 0x97})  # unspecified, implementation specific, id in use, quota


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[None]
    wire_bytes: int
    sent_at_s: float  # loop time when it was written


class Owner(Protocol):
    """What a connection may call on the endpoint that owns it (``transport.MqttUpstream``), and nothing more: the
    connection reports room in the window and round trips, and hands on what the broker published to us."""

    def window_changed(self) -> None:
        """A PUBACK came, or the connection was lost."""

    def round_trip(self, rtt_s: float) -> None:
        """A PUBLISH was acknowledged with success ``rtt_s`` after it was written."""

    def cloud_message(self, conn: Connection, message: CloudMessage) -> None:
        """The broker published ``message`` on ``conn``; the owner has it acknowledged (``conn.ack``) once handled."""

    def subscribed(self, conn: Connection) -> None:
        """Every SUBACK of ``conn``'s subscriptions (``subscribe``) is in."""


class Connection(asyncio.Protocol):
    """One connection to the broker. ``connack`` resolves on the CONNACK (a refusal: ``TransportError`` PERMANENT);
    ``lost`` is set once the connection is gone, ``lost_reason`` says why."""

    def __init__(self, owner: Owner, settings: MqttUpstreamSettings, refusals: RefusalLog) -> None:
        self.owner = owner
        self.loop = asyncio.get_running_loop()
        self._settings = settings
        self._refusals = refusals
        self._peer = f"{settings.host}:{settings.port}"
        self._v5 = settings.protocol is MqttProtocol.V5
        self._decoder = BrokerDecoder(v5=self._v5, max_packet_bytes=settings.max_packet_bytes)
        self._transport: asyncio.Transport | None = None
        self._closed = asyncio.Event()  # the socket is closed (connection_lost ran)
        self.pending: dict[int, _Pending] = {}
        self.inflight_bytes = 0
        # What the broker allows: QoS 1 PUBLISHes awaiting their PUBACK at once (MQTT 5's CONNACK; 3.1.1 brokers
        # announce nothing), and the largest packet (the smaller of the CONNACK's and the setting's; None: MQTT's own).
        self.receive_maximum = _MQTT_RECEIVE_MAXIMUM
        self.max_packet_out: int | None = settings.broker_max_packet_bytes
        self.alive = False
        self.connack: asyncio.Future[None] = self.loop.create_future()
        self.connack.add_done_callback(lambda f: f.cancelled() or f.exception())  # awaited, or not: either is fine
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self.subscribing: set[int] = set()  # SUBSCRIBE packet ids awaiting their SUBACK
        self._unawaited: set[int] = set()  # QoS 1 PUBLISHes nobody waits for (twin reports): ids still taken
        self._held: deque[tuple[str, bytes]] = deque()  # QoS 1 reports waiting for a Receive Maximum slot
        self._ids = PacketIds()
        self._keepalive_s = float(settings.keepalive_s)
        self._heard_at = self._wrote_at = self.loop.time()
        self._asked_at: float | None = None  # since when an answer is awaited with nothing heard (None: none is)
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's too)
        s = self._settings
        password = s.sas_token or s.password
        username = s.username
        if s.sas_token and username is None:
            username = f"{s.host}/{s.client_id}/?api-version=2021-04-12"
        self._write(
            connect_packet(
                v5=self._v5,
                client_id=s.client_id,
                keepalive_s=s.keepalive_s,
                clean=s.session_expiry_s == 0,
                username=username,
                password=password,
                session_expiry_s=s.session_expiry_s,
                max_packet_bytes=s.max_packet_bytes,
            )
        )
        self._heard_at = self.loop.time()
        self._arm_keepalive()

    def data_received(self, data: bytes) -> None:
        if self.lost.is_set():
            return
        self._heard_at = self.loop.time()
        try:
            packets = self._decoder.feed(data)
        except RemoteProtocolError as exc:
            reason = RefusalReason.PACKET_TOO_LARGE if exc.reason_code == TOO_LARGE else RefusalReason.MALFORMED_PACKET
            self._refusals.refused(reason, peer=self._peer, client=self._settings.client_id, detail=str(exc))
            self.drop(f"protocol error from the broker: {exc}", abort=True)
            return
        for packet in packets:
            if self.lost.is_set():
                return
            self._dispatch(packet)
        # Heard: what is still awaited has waited since now (a PINGREQ is answered by anything heard).
        self._asked_at = self._heard_at if self.pending or self.subscribing or self._unawaited else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed.set()
        self._cancel_timer()
        self._on_lost(f"connection closed: {exc!r}" if exc is not None else "connection closed by the broker")

    # -- what the broker sent --------------------------------------------------------------------------------

    def _dispatch(self, packet: BrokerPacket) -> None:
        if isinstance(packet, PubAckIn):
            self._on_puback(packet)
        elif isinstance(packet, PublishIn):
            m = CloudMessage(
                packet.topic,
                packet.payload,
                packet.qos,
                packet.packet_id,
                packet.user_properties,
                packet.content_type,
                packet.correlation_data,
            )
            self.owner.cloud_message(self, m)
        elif isinstance(packet, SkippedPublishIn):
            # Acknowledged, so the broker stops sending it again; dropped, since nothing of it was kept.
            self._refusals.refused(
                RefusalReason.PACKET_TOO_LARGE,
                peer=self._peer,
                client=self._settings.client_id,
                topic=shown(packet.topic),
                bytes=packet.size_bytes,
                limit=self._settings.max_packet_bytes,
                outcome="acknowledged_and_dropped",
            )
            self.ack(packet.packet_id, packet.qos)
        elif isinstance(packet, ConnAckIn):
            self._on_connack(packet)
        elif isinstance(packet, SubAckIn):
            self.subscribing.discard(packet.packet_id)
            if not self.subscribing:
                self.owner.subscribed(self)
        elif isinstance(packet, DisconnectIn):
            why = f" ({packet.reason})" if packet.reason else ""
            self.drop(f"disconnected by the broker: reason 0x{packet.code:02x}{why}", send_disconnect=False)
        # PINGRESP: hearing it is all it is for (data_received noted the time).

    def _on_connack(self, ack: ConnAckIn) -> None:
        if self.connack.done():
            self.drop("a second CONNACK", abort=True)
            return
        if ack.refused:
            what = ack.reason or _CONNACK_REFUSALS.get(ack.code, "refused")
            self.connack.set_exception(
                TransportError(f"CONNACK refused: 0x{ack.code:02x} {what}", kind=FailureKind.PERMANENT)
            )
            self.drop(f"CONNACK refused: 0x{ack.code:02x}", send_disconnect=False)
            return
        if ack.server_keepalive_s is not None:
            self._keepalive_s = float(ack.server_keepalive_s)
            self._arm_keepalive()
        if ack.receive_maximum is not None:
            self.receive_maximum = ack.receive_maximum
        announced = ack.maximum_packet_size
        if announced is not None:
            self.max_packet_out = min(announced, self.max_packet_out or announced)
        self.alive = True
        self.connack.set_result(None)

    def _on_puback(self, ack: PubAckIn) -> None:
        if self._unawaited and ack.packet_id in self._unawaited:
            self._unawaited.discard(ack.packet_id)
            self._release_held()
            self.owner.window_changed()
            return
        p = self.pending.pop(ack.packet_id, None)
        if p is None:
            return
        self._release_held()
        self.inflight_bytes -= p.wire_bytes
        failed = ack.code >= 0x80
        if not failed:
            self.owner.round_trip(self.loop.time() - p.sent_at_s)
        if not p.future.done():
            if failed:
                why = f" ({ack.reason})" if ack.reason else ""
                kind = FailureKind.TRANSIENT if ack.code in _PUBACK_TRANSIENT else FailureKind.PERMANENT
                p.future.set_exception(TransportError(f"PUBACK reason 0x{ack.code:02x}{why}", kind=kind))
            else:
                p.future.set_result(None)
        self.owner.window_changed()

    # -- what we send ----------------------------------------------------------------------------------------

    @property
    def batch_slot_free(self) -> bool:
        """Whether ``publish_unit`` may send one more PUBLISH within the broker's Receive Maximum, which counts our
        QoS 1 PUBLISHes awaiting their PUBACK; one is left to ``publish`` unless the maximum is 1. (A held report
        takes a slot the moment a PUBACK frees one, before the batches hear of it.)"""
        slots = self.receive_maximum - 1 if self.receive_maximum > 1 else 1
        return self._awaiting_puback() < slots

    def _awaiting_puback(self) -> int:
        return len(self.pending) + len(self._unawaited)

    def fits(self, wire_bytes: int) -> bool:
        """Whether a packet of ``wire_bytes`` is within the broker's Maximum Packet Size."""
        return self.max_packet_out is None or wire_bytes <= self.max_packet_out

    def publish_unit(self, unit: Unit) -> asyncio.Future[None]:
        """PUBLISH ``unit`` at QoS 1; the future resolves on its PUBACK (or fails with the connection). A PUBLISH
        over the broker's Maximum Packet Size is not sent: it fails at once, PERMANENT (the broker would close the
        connection, and the same PUBLISH would close the next one)."""
        fut: asyncio.Future[None] = self.loop.create_future()
        # A send cancelled mid-way (close, shutdown) leaves futures nobody awaits; their failure is expected.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        if not self.alive:
            fut.set_exception(TransportError(f"connection lost: {self.lost_reason}"))
            return fut
        pid = self._take_id()
        packet = publish_packet(unit.topic, unit.payload, qos=1, packet_id=pid, v5=self._v5, props=unit.properties)
        if not self.fits(len(packet)):
            fut.set_exception(TransportError(self._too_large(len(packet)), kind=FailureKind.PERMANENT))
            return fut
        self.pending[pid] = _Pending(fut, unit.wire_bytes, self.loop.time())
        self.inflight_bytes += unit.wire_bytes
        self._write(packet)
        self._asking()
        return fut

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        """PUBLISH an answer or a report nobody awaits (QoS 0 or 1); dropped when the connection is gone. A QoS 1
        report that finds the broker's Receive Maximum reached is held until a PUBACK frees a slot."""
        if not self.alive:
            return
        if qos and (self._held or self._awaiting_puback() >= self.receive_maximum):
            if len(self._held) >= _MAX_HELD:
                dropped, _ = self._held.popleft()
                self._refusals.refused(
                    RefusalReason.QUOTA_EXCEEDED,
                    peer=self._peer,
                    client=self._settings.client_id,
                    topic=shown(dropped),
                    detail=f"{_MAX_HELD} reports already wait for the broker's Receive Maximum of "
                    f"{self.receive_maximum}: the oldest dropped",
                )
            self._held.append((topic, payload))
            return
        self._send(topic, payload, qos)

    def _send(self, topic: str, payload: bytes, qos: int) -> None:
        pid = self._take_id() if qos else 0
        packet = publish_packet(topic, payload, qos=qos, packet_id=pid, v5=self._v5)
        if not self.fits(len(packet)):
            self._refusals.refused(
                RefusalReason.MESSAGE_TOO_LARGE,
                peer=self._peer,
                client=self._settings.client_id,
                topic=shown(topic),
                detail=self._too_large(len(packet)),
            )
            return
        if qos:
            self._unawaited.add(pid)
        self._write(packet)
        if qos:
            self._asking()

    def _release_held(self) -> None:
        """Write the held reports the Receive Maximum now has room for, oldest first."""
        while self._held and self._awaiting_puback() < self.receive_maximum:
            topic, payload = self._held.popleft()
            self._send(topic, payload, 1)

    def subscribe(self, filters: list[tuple[str, int]]) -> None:
        """SUBSCRIBE to ``filters`` (one packet); ``owner.subscribed`` is called once every SUBACK is in."""
        if not self.alive or not filters:
            return
        pid = self._take_id()
        self.subscribing.add(pid)
        self._write(subscribe_packet(pid, filters, v5=self._v5))
        self._asking()

    def ack(self, mid: int, qos: int) -> None:
        """PUBACK a PUBLISH the broker sent on this connection (QoS 0: nothing to send)."""
        if qos > 0 and self.alive:
            self._write(puback_packet(mid))

    def _too_large(self, size: int) -> str:
        return f"PUBLISH of {size} bytes is over the broker's Maximum Packet Size of {self.max_packet_out}"

    def _take_id(self) -> int:
        """The next packet id not in use; the window bounds what is in flight far below 65,535."""
        pid = self._ids.take(self._in_use)
        if pid is None:
            raise TransportError("no free packet id: 65,535 packets awaiting their ack")
        return pid

    def _in_use(self, pid: int) -> bool:
        return pid in self.pending or pid in self.subscribing or pid in self._unawaited

    def _asking(self) -> None:
        """Something that needs an answer was written: the wait for one starts now, unless one is under way."""
        if self._asked_at is None:
            self._asked_at = self._wrote_at

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)
            self._wrote_at = self.loop.time()

    # -- keepalive -------------------------------------------------------------------------------------------

    def _arm_keepalive(self) -> None:
        self._cancel_timer()
        if self._keepalive_s > 0 and not self.lost.is_set():
            due = min(self._wrote_at + self._keepalive_s, self._heard_at + 1.5 * self._keepalive_s)
            due = min(due, self._silent_due())
            self._timer = self.loop.call_at(due, self._keepalive_tick)

    def _silent_due(self) -> float:
        """When a connection awaiting an answer is lost: a keepalive after it last heard anything, once the
        question has had half a keepalive (a fresh one after a quiet spell gets time for its round trip)."""
        if self._asked_at is None:
            return float("inf")
        return max(self._heard_at + self._keepalive_s, self._asked_at + self._keepalive_s / 2)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _keepalive_tick(self) -> None:
        self._timer = None
        now = self.loop.time()
        if now >= self._heard_at + 1.5 * self._keepalive_s or now >= self._silent_due():
            silent_s = now - self._heard_at
            self.drop(f"keepalive: nothing from the broker for {silent_s:.1f}s", abort=True)
            return
        if now >= self._wrote_at + self._keepalive_s:
            self._write(pingreq_packet())
            self._asking()
        self._arm_keepalive()

    # -- the end ---------------------------------------------------------------------------------------------

    def _on_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.alive = False
        self.lost_reason = reason
        self._cancel_timer()
        if not self.connack.done():
            self.connack.set_exception(TransportError(f"connection lost before CONNACK: {reason}"))
        for p in self.pending.values():
            if not p.future.done():
                p.future.set_exception(TransportError(f"connection lost before PUBACK: {reason}"))
        self.pending.clear()
        self.inflight_bytes = 0
        self.lost.set()
        self.owner.window_changed()

    def drop(self, reason: str, *, send_disconnect: bool = True, abort: bool = False) -> None:
        """Give up on this connection now (ack timeout, close, a broker that broke the protocol): fail what is
        pending, send DISCONNECT if it was up, close the socket (``abort``: at once, for a link that is silent or
        a peer we no longer read)."""
        was_alive = self.alive
        self._on_lost(reason)
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if was_alive and send_disconnect and not abort:
            transport.write(disconnect_packet())
        if abort:
            transport.abort()
        else:
            transport.close()

    async def stop(self) -> None:
        """Return once the socket is closed (a close that hangs is aborted after a short grace)."""
        if self._transport is None:
            return
        try:
            async with asyncio.timeout(_CLOSE_GRACE_S):
                await self._closed.wait()
        except TimeoutError:
            self._transport.abort()
            await self._closed.wait()


async def open_connection(owner: Owner, s: MqttUpstreamSettings, refusals: RefusalLog) -> Connection:
    """Connect to ``s.host`` (TCP, TLS as set) and wait for the CONNACK, all within ``s.connect_timeout_s``.
    Raises ``TransportError``: TIMEOUT for a silent link, PERMANENT for a CONNACK refusal, TRANSIENT otherwise."""
    loop = asyncio.get_running_loop()
    conn = Connection(owner, s, refusals)
    context: ssl.SSLContext | None = None
    if s.tls is not None:
        context = ssl.create_default_context(cafile=s.tls.ca_certs)
        context.check_hostname = s.tls.check_hostname
        if s.tls.certfile:
            context.load_cert_chain(s.tls.certfile, s.tls.keyfile)
    try:
        async with asyncio.timeout(s.connect_timeout_s):
            if s.proxy is None and s.websocket_path is None:
                # server_hostname: the host, for SNI and (with check_hostname) the certificate's name.
                await loop.create_connection(lambda: conn, s.host, s.port, ssl=context)
            else:  # through a proxy, over a WebSocket, or both; loaded only then (wsproto: about 1.2 MB of RSS)
                from edgehub.upstream.mqtt.stream import dial

                await dial(conn, host=s.host, port=s.port, tls=context, proxy=s.proxy, websocket_path=s.websocket_path)
            await conn.connack
    except TimeoutError as exc:  # a silent link: no SYN-ACK, no handshake or no CONNACK in time
        conn.drop("no CONNACK in time", abort=True)
        await conn.stop()
        raise TransportError(
            f"no CONNACK from {s.host}:{s.port} within {s.connect_timeout_s}s", kind=FailureKind.TIMEOUT
        ) from exc
    except TransportError:
        conn.drop("no CONNACK", abort=True)
        await conn.stop()
        raise
    except (OSError, ValueError) as exc:  # refused, reset, unreachable, a failed TLS handshake (ssl.SSLError)
        conn.drop(f"connect failed: {exc!r}", abort=True)
        await conn.stop()
        raise TransportError(f"connect to {s.host}:{s.port} failed: {exc!r}", kind=FailureKind.TRANSIENT) from exc
    return conn
