"""The MQTT upstream's paho side: one paho client per connection, and the PUBLISHes it has in flight.

paho runs its own network thread; its callbacks only hand events to the asyncio loop
(``loop.call_soon_threadsafe``), and every piece of state here is touched on the loop only.

Invariants: every connection is a fresh paho client with ``reconnect_on_failure=False``, so paho never resends
a previous connection's PUBLISHes behind our back and what is in flight is exactly what ``Connection`` counts;
``inflight_bytes`` is the sum of the wire bytes of the PUBLISHes awaiting their PUBACK; once the connection is
lost, every pending PUBLISH has failed and nothing more is acknowledged on it. The broker's PUBLISHes to us
(device-bound messages, method calls: ``mqtt_cloud``) are acknowledged by us (paho's manual ack), once handled.

The session outlives the connection (``session_expiry_s``, 1 day by default: MQTT 3.1.1 clean_session=False, MQTT
5 clean_start=False with that session expiry interval), so the broker keeps our subscriptions and queues the QoS 1
device-bound messages that come while the hub is away, and sends again those it sent but we had not acknowledged.
It does not make our own PUBLISHes survive a connection: the broker keeps no state for QoS 1 PUBLISHes it
received, and paho's resend of unacknowledged PUBLISHes on reconnect applies to the same client object only, which
we never reuse. A PUBLISH whose PUBACK was lost is therefore failed to the executor and sent again in a later batch,
as with a clean session; receivers remove the duplicate (``edge_message_id``, ``$.mid``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgehub.core import FailureKind, TransportError
from edgehub.upstream.mqtt_cloud import CloudMessage
from edgehub.upstream.mqtt_settings import MqttProtocol, MqttUpstreamSettings
from edgehub.upstream.mqtt_wire import Unit

if TYPE_CHECKING:
    from edgehub.upstream.mqtt_transport import MqttUpstream

__all__ = ["Connection", "connect_client", "new_client"]


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[None]
    wire_bytes: int
    sent_at_s: float  # loop time when it was handed to the client


class Connection:
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
        client.on_message = self._t_on_message
        client.on_subscribe = self._t_on_subscribe
        self.subscribing: set[int] = set()  # SUBSCRIBE packet ids awaiting their SUBACK

    # paho's thread: hand everything to the loop.
    def _t_on_connect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.loop.call_soon_threadsafe(self._on_connect, bool(rc.is_failure), str(rc))

    def _t_on_disconnect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.loop.call_soon_threadsafe(self._on_lost, f"disconnected: {rc}")

    def _t_on_publish(self, c: paho.Client, u: Any, mid: int, rc: Any, props: Any) -> None:
        self.loop.call_soon_threadsafe(self._on_ack, mid, bool(rc.is_failure), str(rc))

    def _t_on_message(self, c: paho.Client, u: Any, msg: paho.MQTTMessage) -> None:
        props = getattr(msg, "properties", None)
        user = tuple(getattr(props, "UserProperty", ()) or ())
        content_type = getattr(props, "ContentType", None)
        correlation = getattr(props, "CorrelationData", None)
        m = CloudMessage(msg.topic, bytes(msg.payload), msg.qos, msg.mid, user, content_type, correlation)
        self.loop.call_soon_threadsafe(self.owner._inbound.received, self, m)

    def _t_on_subscribe(self, c: paho.Client, u: Any, mid: int, rcs: Any, props: Any) -> None:
        self.loop.call_soon_threadsafe(self._on_suback, mid)

    # the loop.
    def _on_suback(self, mid: int) -> None:
        self.subscribing.discard(mid)
        if not self.subscribing:
            self.owner._inbound.subscribed(self)

    def subscribe(self, filters: list[tuple[str, int]]) -> None:
        """SUBSCRIBE to ``filters`` (one packet); ``owner._inbound.subscribed`` is called once every SUBACK is in."""
        rc, mid = self.client.subscribe(filters)
        if rc == paho.MQTT_ERR_SUCCESS and mid is not None:
            self.subscribing.add(mid)

    def ack(self, mid: int, qos: int) -> None:
        """PUBACK a PUBLISH the broker sent on this connection (QoS 0: nothing to send)."""
        if qos > 0 and self.alive:
            self.client.ack(mid, qos)

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

    def publish(self, unit: Unit) -> asyncio.Future[None]:
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
        # paho (2.1) leaves open the socket pair that wakes its loop thread when the loop ended on a refused
        # CONNACK: closed here, so that no descriptor outlives the connection (a hub retrying bad credentials
        # would leak two a try).
        for name in ("_sockpairR", "_sockpairW"):
            sock = getattr(self.client, name, None)
            if sock is not None:
                sock.close()
                setattr(self.client, name, None)


def new_client(s: MqttUpstreamSettings) -> paho.Client:
    """A paho client for one connection to ``s.host``: configured (credentials, TLS), not yet connected."""
    v5 = s.protocol is MqttProtocol.V5
    client = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=s.client_id,
        clean_session=None if v5 else s.session_expiry_s == 0,
        protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
        reconnect_on_failure=False,  # one connection per client: see the module docstring
        manual_ack=True,  # a device-bound message is acknowledged once the hub has it durably (mqtt_cloud)
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


def connect_client(client: paho.Client, s: MqttUpstreamSettings) -> None:
    """Open ``client``'s connection to the broker (blocking: run it in a thread); on MQTT 5 with the session kept
    for ``session_expiry_s`` (3.1.1 asks for it in ``new_client``, with clean_session)."""
    if s.protocol is not MqttProtocol.V5:
        client.connect(s.host, s.port, s.keepalive_s)
        return
    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    if s.session_expiry_s:
        properties.SessionExpiryInterval = s.session_expiry_s
    client.connect(s.host, s.port, s.keepalive_s, clean_start=s.session_expiry_s == 0, properties=properties)
