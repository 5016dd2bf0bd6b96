"""The server side of one MQTT connection, sans-IO: ``receive_data(bytes)`` → events; actions → ``data_to_send()``.

The whole protocol logic is the transition table (``states.TRANSITIONS``) plus one handler per trigger here; the
asyncio adapter (``server.py``) only moves bytes, runs timers and asks the hub.

Invariants:
* CONNECT first: any other packet before it closes the connection. Packets a client pipelines after CONNECT
  are held, unprocessed, until the server ``accept``s (they come back from ``accept()``) or refuses.
* Inbound QoS 1 and 2 messages get an ack slot (a *ticket*) in arrival order. The ack (PUBACK, or PUBREC for
  QoS 2) goes out only when the hub ``settle``s the ticket, and acks leave **in arrival order**: a settled
  ticket waits behind an unsettled older one. A negative settlement (reason ≥ 0x80) is sent as a negative ack
  to an MQTT 5 client; an MQTT 3.1.1 client, which has no negative ack, is disconnected instead, without that
  ack or any later one.
* QoS 2 is exactly-once towards the hub: a PUBLISH whose packet id is still awaiting PUBREL is not delivered
  again; PUBREL is answered with PUBCOMP.
* Outbound messages are QoS 0 or 1, at most ``outbound_window`` (and the client's Receive Maximum) in flight;
  ``inflight()`` gives them back for redelivery with DUP on a later connection of the same session.
* Every protocol failure ends in state CLOSED with the reason told to the peer where MQTT 5 allows it
  (CONNACK before the session exists, DISCONNECT after); the failure is reported as a ``ProtocolFailed``
  event, never raised out of ``receive_data``. Misuse of this API by the server raises ``LocalProtocolError``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from edgehub.core import LocalProtocolError, RemoteProtocolError
from edgehub.mqtt.caches import TOPIC_CACHE_BYTES, BudgetDict
from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import UnsendablePacket, encode
from edgehub.mqtt.fastpaths import encode_qos1_publish, plain_puback_ids, puback_success
from edgehub.mqtt.packets import (
    MAX_VARINT,
    MQTT_50,
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PropertyId,
    ProtocolViolation,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from protocol_heads.mqtt.acks import AckQueue
from protocol_heads.mqtt.events import (
    ConnectRequested,
    DeliveryAcked,
    Disconnected,
    Event,
    MessageReceived,
    ProtocolFailed,
    SubscribeRequested,
    UnsubscribeRequested,
)
from protocol_heads.mqtt.states import ROWS, TRANSITIONS, TRIGGER_OF, ConnectionState, Trigger

__all__ = [
    "ROWS",
    "TRANSITIONS",
    "TRIGGER_OF",
    "ConnectRequested",
    "ConnectionState",
    "DeliveryAcked",
    "Disconnected",
    "Event",
    "MessageReceived",
    "PeerPacketTooLarge",
    "ProtocolFailed",
    "ServerConnection",
    "SubscribeRequested",
    "Trigger",
    "UnsubscribeRequested",
    "v311_connack_code",
]

log = logging.getLogger(__name__)

# The states and the per-message triggers as module names, read for every packet: reading
# ``ConnectionState.CLOSED`` goes through the Enum class's attribute look-up, a module global is cached.
_AWAIT_CONNECT: Final = ConnectionState.AWAIT_CONNECT
_AUTHENTICATING: Final = ConnectionState.AUTHENTICATING
_CONNECTED: Final = ConnectionState.CONNECTED
_CLOSED: Final = ConnectionState.CLOSED
_SEND_MESSAGE: Final = Trigger.SEND_MESSAGE
_SETTLE: Final = Trigger.SETTLE


class PeerPacketTooLarge(UnsendablePacket):
    """An outbound packet is over the client's Maximum Packet Size; it was not sent."""


def v311_connack_code(reason: int) -> int:
    """The MQTT 3.1.1 CONNACK return code closest to an MQTT 5 reason code."""
    if reason < 0x80:
        return 0
    table: dict[int, int] = {
        ReasonCode.UNSUPPORTED_PROTOCOL_VERSION: 0x01,
        ReasonCode.CLIENT_IDENTIFIER_NOT_VALID: 0x02,
        ReasonCode.SERVER_UNAVAILABLE: 0x03,
        ReasonCode.SERVER_BUSY: 0x03,
        ReasonCode.SERVER_SHUTTING_DOWN: 0x03,
        ReasonCode.BAD_USERNAME_OR_PASSWORD: 0x04,
    }
    return table.get(reason, 0x05)


class _Qos2(msgspec.Struct, gc=False):
    ticket: int
    rec_sent: bool = False
    rec_reason: int = 0


class ServerConnection:
    """One client connection, server side. Not thread-safe; one asyncio task drives it.

    Settings (keyword-only):
    * ``max_packet_size``: the largest packet accepted from the client; larger ones close the connection
      with 0x95 (announced to MQTT 5 clients in CONNACK).
    * ``receive_maximum``: how many unsettled QoS 1/2 messages the client may have; more is 0x93.
    * ``outbound_window``: how many outbound QoS 1 messages may be in flight at once.
    * ``topic_alias_maximum``: how many inbound topic aliases an MQTT 5 client may use.
    * ``topic_cache_bytes``: what the decoder and the encoder may each keep of the connection's topics.
    """

    def __init__(
        self,
        *,
        max_packet_size: int = 1 << 20,
        receive_maximum: int = 1024,
        outbound_window: int = 16,
        topic_alias_maximum: int = 16,
        topic_cache_bytes: int = TOPIC_CACHE_BYTES,
    ) -> None:
        if not 1 <= receive_maximum <= 0xFFFF or outbound_window < 1 or not 0 <= topic_alias_maximum <= 0xFFFF:
            raise ValueError("receive_maximum, outbound_window or topic_alias_maximum out of range")
        self.state = _AWAIT_CONNECT  # moved only by _move, along the table
        self._row = ROWS[self.state]
        self.max_packet_size = max_packet_size
        self.receive_maximum = receive_maximum
        self.outbound_window = outbound_window
        self.topic_alias_maximum = topic_alias_maximum
        self.connect: Connect | None = None
        self.protocol_level = 4
        self._decoder = Decoder(max_packet_size=max_packet_size, topic_cache_bytes=topic_cache_bytes)
        self._names: BudgetDict[str, bytes] = BudgetDict(topic_cache_bytes)  # outbound topics' wire bytes
        self._out = bytearray()
        self._held: list[Packet] = []
        self._acks = AckQueue(receive_maximum)
        self._qos2: dict[int, _Qos2] = {}
        self._aliases: dict[int, str] = {}
        self._inflight: dict[int, Publish] = {}
        self._next_packet_id = 1
        # Outbound QoS 1 messages in flight at most: also under the client's Receive Maximum, and the ids there are.
        self._window = min(outbound_window, 0xFFFF)
        self._peer_max_packet_size = MAX_VARINT + 5

    # --- properties --------------------------------------------------------------------------------------

    @property
    def v5(self) -> bool:
        return self.protocol_level == MQTT_50

    @property
    def closed(self) -> bool:
        return self.state is _CLOSED

    @property
    def keepalive_timeout_s(self) -> float | None:
        """How long the client may stay silent: 1.5 times its keepalive [MQTT-3.1.2-24]; None when 0."""
        if self.connect is None or self.connect.keepalive_s == 0:
            return None
        return 1.5 * self.connect.keepalive_s

    @property
    def unsettled(self) -> int:
        """Inbound QoS 1/2 messages whose ack has not gone out yet."""
        return len(self._acks)

    @property
    def window_free(self) -> int:
        """How many more outbound QoS 1 messages may be sent now (none once the connection is closed)."""
        return 0 if self.state is _CLOSED else max(0, self._window - len(self._inflight))

    def inflight(self) -> dict[int, Publish]:
        """Outbound QoS 1 messages not yet acknowledged, by packet id, in send order."""
        return dict(self._inflight)

    def data_to_send(self) -> bytes:
        """Bytes to write to the socket, accumulated since the last call."""
        out = bytes(self._out)
        self._out.clear()
        return out

    # --- inbound -----------------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the socket; every event they complete, in order. Never raises for bad input."""
        if self.closed:
            return []
        try:
            packets = self._decoder.receive_data(data)
        except RemoteProtocolError as exc:
            return [self._fail(exc)]
        return self._handle_all(packets)

    def _handle_all(self, packets: list[Packet]) -> list[Event]:
        """Each packet in turn, until the connection closes; a protocol failure becomes a ProtocolFailed event."""
        events: list[Event] = []
        for packet in packets:
            state = self.state
            if state is _CLOSED:
                break
            if state is _AUTHENTICATING:
                # Pipelined after CONNECT: kept until the server has decided.
                self._held.append(packet)
                continue
            try:
                self._handle(packet, events)
            except RemoteProtocolError as exc:
                events.append(self._fail(exc))
        return events

    def discard_input(self) -> None:
        """No more bytes will be fed: free what is buffered of an incomplete packet."""
        self._decoder.discard_partial()

    def receive_acks(self, data: bytes) -> list[int] | None:
        """``receive_data`` for a read of nothing but plain PUBACKs (``fastpaths.plain_puback_ids``): the packet
        ids of the deliveries they acknowledge, as its ``DeliveryAcked`` events would have given them (reason
        code success), without the events. None for anything else: nothing was consumed, and ``receive_data``
        takes the bytes."""
        if PubAck not in self._row or not self._decoder.at_packet_boundary():
            return None
        ids = plain_puback_ids(data)
        if ids is None:
            return None
        return self._acked(ids)

    def _handle(self, packet: Packet, events: list[Event]) -> None:
        """One packet from the client, through the table (its next state, looked up by its type), then its handler."""
        nxt = self._row.get(type(packet))
        if nxt is None:
            trigger = TRIGGER_OF.get(type(packet))
            if trigger is None:
                raise ProtocolViolation(f"a client does not send {type(packet).__name__.upper()}")
            raise ProtocolViolation(f"{trigger.value} in state {self.state.value}")
        if isinstance(packet, Publish):  # the per-message packets first
            self._on_publish(packet, events)
        elif isinstance(packet, PubAck):
            if self._acked((packet.packet_id,)):
                events.append(DeliveryAcked(packet.packet_id, packet.reason_code))
        elif isinstance(packet, Connect):
            self._on_connect(packet, events)
        elif isinstance(packet, PubRel):
            self._on_pubrel(packet)
        elif isinstance(packet, Subscribe):
            events.append(SubscribeRequested(packet))
        elif isinstance(packet, Unsubscribe):
            events.append(UnsubscribeRequested(packet))
        elif isinstance(packet, PingReq):
            self._send(PingResp())
        elif isinstance(packet, Disconnect):
            expiry = packet.properties.get_int(PropertyId.SESSION_EXPIRY_INTERVAL)
            events.append(Disconnected(packet.reason_code, packet.reason_code == 0x04, expiry))
        elif isinstance(packet, Auth):
            # Enhanced authentication is not offered; an AUTH packet is a protocol error [MQTT-4.12.0-1].
            raise ProtocolViolation("AUTH without an authentication method", reason_code=ReasonCode.PROTOCOL_ERROR)
        if nxt is not self.state:
            self._move(nxt)

    def _acked(self, packet_ids: Iterable[int]) -> list[int]:
        """The client acknowledged these outbound packet ids: they leave the window. The ones that were in flight
        (a read of PUBACKs is settled in one call, not one per message)."""
        pop = self._inflight.pop
        return [pid for pid in packet_ids if pop(pid, None) is not None]

    def _on_connect(self, c: Connect, events: list[Event]) -> None:
        self.connect = c
        self.protocol_level = c.protocol_level
        if c.protocol_level == MQTT_50:
            rm = c.properties.get_int(PropertyId.RECEIVE_MAXIMUM)
            if rm == 0:
                raise ProtocolViolation("Receive Maximum 0")
            if rm is not None:
                self._window = min(self.outbound_window, rm)
            mps = c.properties.get_int(PropertyId.MAXIMUM_PACKET_SIZE)
            if mps == 0:
                raise ProtocolViolation("Maximum Packet Size 0")
            if mps is not None:
                self._peer_max_packet_size = mps
        events.append(ConnectRequested(c))

    def _on_publish(self, p: Publish, events: list[Event]) -> None:
        if self.protocol_level == MQTT_50:
            alias = p.properties.get_int(PropertyId.TOPIC_ALIAS)
            if alias is not None:
                if alias == 0 or alias > self.topic_alias_maximum:
                    raise ProtocolViolation(f"topic alias {alias}", reason_code=ReasonCode.TOPIC_ALIAS_INVALID)
                if p.topic:
                    self._aliases[alias] = p.topic
                elif alias in self._aliases:
                    p = msgspec.structs.replace(p, topic=self._aliases[alias])
                else:
                    raise ProtocolViolation(f"unknown topic alias {alias}")
        if not p.topic:
            raise ProtocolViolation("empty topic name", reason_code=ReasonCode.TOPIC_NAME_INVALID)
        if p.retain and self.protocol_level == MQTT_50:
            # CONNACK said Retain Available 0; a retained PUBLISH is then 0x9A [MQTT-3.3.1-8]. A 3.1.1 client
            # has no way to be told, so its retain flag is ignored (the message is still telemetry).
            raise ProtocolViolation("retained messages are not available", reason_code=ReasonCode.RETAIN_NOT_SUPPORTED)
        if p.qos == 0:
            events.append(MessageReceived(p, None))
            return
        assert p.packet_id is not None  # the decoder guarantees it for QoS > 0
        if p.qos == 2:
            known = self._qos2.get(p.packet_id)
            if known is not None:
                # A resend of a message the hub already has: never deliver twice; repeat PUBREC if it went out.
                if known.rec_sent:
                    self._send(PubRec(p.packet_id, known.rec_reason))
                return
        ticket = self._acks.open(p.qos, p.packet_id)
        if p.qos == 2:
            self._qos2[p.packet_id] = _Qos2(ticket)
        events.append(MessageReceived(p, ticket))

    def _on_pubrel(self, rel: PubRel) -> None:
        state = self._qos2.get(rel.packet_id)
        if state is None:
            self._send(PubComp(rel.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
            return
        if not state.rec_sent:
            raise ProtocolViolation(f"PUBREL {rel.packet_id} before PUBREC")
        del self._qos2[rel.packet_id]
        self._send(PubComp(rel.packet_id))

    # --- server actions ----------------------------------------------------------------------------------

    def _go(self, trigger: Trigger) -> None:
        """A server action, through the table: a LocalProtocolError where the current state has no such move."""
        nxt = self._row.get(trigger)
        if nxt is None:
            raise LocalProtocolError(f"cannot {trigger.value} in state {self.state.value}")
        if nxt is not self.state:
            self._move(nxt)

    def _move(self, state: ConnectionState) -> None:
        self.state = state
        self._row = ROWS[state]

    def accept(self, *, session_present: bool = False, properties: Properties | None = None) -> list[Event]:
        """Send CONNACK success; returns the events of packets the client pipelined after CONNECT."""
        self._go(Trigger.ACCEPT)
        if self.v5:
            values: dict[PropertyId, int | str | bytes] = {
                PropertyId.RECEIVE_MAXIMUM: self.receive_maximum,
                # Maximum QoS is left out: it may only say 0 or 1, and absent means 2 [MQTT-3.2.2-9].
                PropertyId.RETAIN_AVAILABLE: 0,
                PropertyId.MAXIMUM_PACKET_SIZE: self.max_packet_size,
                PropertyId.TOPIC_ALIAS_MAXIMUM: self.topic_alias_maximum,
                PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
                PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 0,
                PropertyId.SHARED_SUBSCRIPTION_AVAILABLE: 0,
            }
            user: tuple[tuple[str, str], ...] = ()
            if properties is not None:
                values.update(properties.values)
                user = properties.user
            self._send(ConnAck(0, session_present, Properties(values, user)))
        else:
            self._send(ConnAck(0, session_present))
        held, self._held = self._held, []
        return self._handle_all(held)

    def refuse(self, reason_code: int, *, reason: str | None = None) -> None:
        """Send a failing CONNACK (the 3.1.1 return code closest to ``reason_code``) and close."""
        if reason_code < 0x80:
            raise ValueError("a refusal needs a reason code of 0x80 or more")
        self._go(Trigger.REFUSE)
        self._held.clear()
        if self.v5:
            props = Properties({PropertyId.REASON_STRING: reason}) if reason else NO_PROPERTIES
            self._send(ConnAck(reason_code, False, props))
        else:
            self._send(ConnAck(v311_connack_code(reason_code), False))

    def settle(self, ticket: int, reason_code: int = ReasonCode.SUCCESS, *, reason: str | None = None) -> None:
        """The hub's answer for one inbound message: 0 stored, ≥ 0x80 refused. Acks go out in arrival order.
        ``reason``: why it was refused, sent to an MQTT 5 client as the ack's Reason String unless the client
        asked for no problem information or the string would make the ack larger than the client accepts."""
        self.settle_many(((ticket, reason_code, reason),))

    def settle_many(self, answers: Iterable[tuple[int, int, str | None]]) -> None:
        """``settle`` for several messages at once: ``(ticket, reason code, reason)`` each. The acks that become
        due go out together, in arrival order (a group of one read is answered in one call, not one per
        message)."""
        self._go(_SETTLE)
        try:
            self._acks.settle(answers, closed=self.closed)
        finally:
            self._send_due_acks()  # what was settled before a misuse still goes out

    def _send_due_acks(self) -> None:
        if self.closed:
            return
        for head in self._acks.take_due():
            rc = head.reason
            assert rc is not None
            if rc == 0 and head.qos == 1:
                # The common ack: PUBACK success, no properties (the bytes encode() gives, without building it).
                self._out += puback_success(head.packet_id)
                continue
            if rc >= 0x80 and not self.v5:
                # 3.1.1 has no negative ack: losing the connection is the only refusal a client can see.
                # DEBUG: the server logs the refusal itself, rate-limited (RefusalLog).
                log.debug("mqtt.nack_disconnect client=%s reason=0x%02x", self._client_id(), rc)
                self._close_quietly()
                return
            props = self._problem_properties(head.text)
            if head.qos == 1:
                self._send_ack(PubAck(head.packet_id, rc, props), PubAck(head.packet_id, rc))
            else:
                q2 = self._qos2.get(head.packet_id)
                if rc >= 0x80:
                    # A failing PUBREC ends the exchange; the packet id is free again [MQTT-4.3.3].
                    self._qos2.pop(head.packet_id, None)
                elif q2 is not None:
                    q2.rec_sent = True
                    q2.rec_reason = rc
                self._send_ack(PubRec(head.packet_id, rc, props), PubRec(head.packet_id, rc))

    def answer_subscribe(self, packet_id: int, reason_codes: Iterable[int]) -> None:
        """SUBACK: per filter, the granted QoS (0..2) or a failure (0x80; MQTT 5 may use its specific codes)."""
        self._go(Trigger.ANSWER_SUBSCRIPTION)
        codes = tuple(reason_codes)
        if not self.v5:
            codes = tuple(c if c < 0x80 else 0x80 for c in codes)
        self._send(SubAck(packet_id, codes))

    def answer_unsubscribe(self, packet_id: int, reason_codes: Iterable[int]) -> None:
        self._go(Trigger.ANSWER_SUBSCRIPTION)
        self._send(UnsubAck(packet_id, tuple(reason_codes) if self.v5 else ()))

    def send_message(
        self, topic: str, payload: bytes, *, qos: int = 1, properties: Properties = NO_PROPERTIES, dup: bool = False
    ) -> int | None:
        """Send an outbound PUBLISH; returns its packet id (None for QoS 0). Raises LocalProtocolError when the
        window is full, and ``UnsendablePacket`` when the packet can never go (``PeerPacketTooLarge``: the client
        could not take it; ``UnencodableField``: a topic or property MQTT cannot carry); nothing was sent then."""
        if self._row.get(_SEND_MESSAGE) is not self.state:  # the table's answer, without a call when it stays
            self._go(_SEND_MESSAGE)
        if qos not in (0, 1):
            raise LocalProtocolError(f"outbound QoS {qos}: the head sends QoS 0 and 1 only")
        v5 = self.protocol_level == MQTT_50
        packet_id = None
        if qos:  # a free packet id in the window
            inflight = self._inflight
            if len(inflight) >= self._window:
                raise LocalProtocolError("outbound window full")
            packet_id = self._next_packet_id
            while packet_id in inflight:  # ends: the window is under 0xFFFF ids
                packet_id = packet_id % 0xFFFF + 1
            self._next_packet_id = packet_id % 0xFFFF + 1
        publish = Publish(topic, payload, qos, False, dup, packet_id, properties if v5 else NO_PROPERTIES)
        wire = None
        if packet_id is not None and publish.properties is NO_PROPERTIES:
            # A module delivery (one per message): its bytes without encode()'s dispatch, topic bytes cached.
            wire = encode_qos1_publish(topic, payload, packet_id, dup=dup, v5=v5, names=self._names)
        self._send_publish(publish, wire)
        return packet_id

    def resume(self, inflight: Mapping[int, Publish]) -> None:
        """Redeliver a session's unacknowledged messages with DUP, keeping their packet ids [MQTT-4.4.0-1]."""
        self._go(_SEND_MESSAGE)
        for packet_id, publish in inflight.items():
            again = msgspec.structs.replace(publish, dup=True, packet_id=packet_id)
            self._send_publish(again)

    def close(self, reason_code: int = ReasonCode.UNSPECIFIED_ERROR, *, reason: str | None = None) -> None:
        """Server-initiated close: MQTT 5 clients get DISCONNECT (or CONNACK before the session) with the reason."""
        if self.closed:
            return
        before = self.state
        self._go(Trigger.CLOSE)
        if not self.v5:
            return
        props = Properties({PropertyId.REASON_STRING: reason}) if reason else NO_PROPERTIES
        if before is _CONNECTED:
            self._send(Disconnect(reason_code, props))
        elif before is _AUTHENTICATING:
            self._send(ConnAck(max(reason_code, 0x80), False, props))

    # --- internals ---------------------------------------------------------------------------------------

    def _send_publish(self, publish: Publish, wire: bytes | None = None) -> None:
        """Send ``publish`` (``wire``: its bytes, when the caller has them already)."""
        if wire is None:
            wire = encode(publish, self.protocol_level)
        if len(wire) > self._peer_max_packet_size:
            raise PeerPacketTooLarge(f"PUBLISH of {len(wire)} bytes over the client's {self._peer_max_packet_size}")
        if publish.packet_id is not None:
            self._inflight[publish.packet_id] = publish
        self._out += wire

    def _send(self, packet: Packet) -> None:
        self._out += encode(packet, self.protocol_level)

    def _problem_properties(self, text: str | None) -> Properties:
        """A Reason String for an ack, when there is one and the client did not set Request Problem Information
        to 0 (then a Reason String may go only in CONNACK or DISCONNECT [MQTT-3.1.2-29])."""
        if not text or not self.v5 or self.connect is None:
            return NO_PROPERTIES
        if self.connect.properties.get_int(PropertyId.REQUEST_PROBLEM_INFORMATION) == 0:
            return NO_PROPERTIES
        return Properties({PropertyId.REASON_STRING: text})

    def _send_ack(self, ack: Packet, bare: Packet) -> None:
        """Send ``ack``, or ``bare`` (no properties) if ``ack`` is over the client's Maximum Packet Size: a
        Reason String must not make a packet too large for the client [MQTT-3.4.2-2]."""
        wire = encode(ack, self.protocol_level)
        self._out += wire if len(wire) <= self._peer_max_packet_size else encode(bare, self.protocol_level)

    def _client_id(self) -> str:
        return self.connect.client_id if self.connect is not None else "?"

    def _close_quietly(self) -> None:
        self._go(Trigger.CLOSE)
        self._held.clear()

    def _fail(self, exc: RemoteProtocolError) -> ProtocolFailed:
        rc = exc.reason_code if exc.reason_code is not None else ReasonCode.PROTOCOL_ERROR
        # DEBUG: the server logs the refusal from the ProtocolFailed event, rate-limited (RefusalLog).
        log.debug("mqtt.protocol_error client=%s reason=0x%02x detail=%s", self._client_id(), rc, exc)
        if self.state is _AWAIT_CONNECT:
            if rc == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
                # The level is unknown or unsupported: answer in 3.1.1's words [MQTT-3.1.2-2].
                self._out += encode(ConnAck(0x01, False), 4)
        elif self.v5 and self.state is _CONNECTED:
            self._send(Disconnect(rc))
        elif self.v5 and self.state is _AUTHENTICATING:
            self._send(ConnAck(rc, False))
        self._close_quietly()
        return ProtocolFailed(exc)
