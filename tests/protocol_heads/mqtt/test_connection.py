"""The server connection state machine, driven by an in-memory client (h11 style): the client encodes packets
with the codec, the server answers, and the client decodes what the server sent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgehub.core import LocalProtocolError
from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import (
    MQTT_50,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PropertyId,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
)
from protocol_heads.mqtt.connection import (
    ROWS,
    TRANSITIONS,
    TRIGGER_OF,
    ConnectionState,
    ConnectRequested,
    DeliveryAcked,
    Disconnected,
    Event,
    MessageReceived,
    ProtocolFailed,
    ServerConnection,
    SubscribeRequested,
    Trigger,
    UnsubscribeRequested,
)


class Pair:
    """A client (codec only) wired to a ServerConnection in memory."""

    def __init__(self, level: int = 4, **settings: int) -> None:
        self.level = level
        self.server = ServerConnection(**settings)
        self.decoder = Decoder(protocol_level=level)

    def send(self, *packets: Packet) -> list[Event]:
        return self.server.receive_data(b"".join(encode(p, self.level) for p in packets))

    def received(self) -> list[Packet]:
        return self.decoder.receive_data(self.server.data_to_send())

    def connect(self, **kw: object) -> list[Event]:
        events = self.send(Connect("dev1", protocol_level=self.level, **kw))  # type: ignore[arg-type]
        assert isinstance(events[0], ConnectRequested)
        return self.server.accept()


def tickets(events: list[Event]) -> list[int]:
    out = []
    for e in events:
        assert isinstance(e, MessageReceived)
        assert e.ticket is not None
        out.append(e.ticket)
    return out


def test_connect_then_accept_sends_connack_and_connects() -> None:
    pair = Pair()
    [event] = pair.send(Connect("dev1", keepalive_s=20))
    assert event == ConnectRequested(Connect("dev1", keepalive_s=20))
    assert pair.server.state is ConnectionState.AUTHENTICATING
    pair.server.accept()
    assert pair.received() == [ConnAck(0, False)]
    assert pair.server.state.value == "connected"
    assert pair.server.keepalive_timeout_s == 30.0


def test_anything_before_connect_closes_the_connection() -> None:
    pair = Pair()
    [event] = pair.server.receive_data(encode(PingReq()))
    assert isinstance(event, ProtocolFailed)
    assert pair.server.closed
    assert pair.server.receive_data(encode(Connect("x"))) == []


def test_packets_pipelined_after_connect_wait_for_accept() -> None:
    pair = Pair()
    events = pair.send(Connect("dev1"), Publish("t", b"1", 1, packet_id=1), PingReq())
    assert [type(e) for e in events] == [ConnectRequested]
    held = pair.server.accept()
    assert [type(e) for e in held] == [MessageReceived]
    assert pair.received() == [ConnAck(0, False), PingResp()]


def test_refused_connect_v311_gets_the_closest_return_code_and_closes() -> None:
    pair = Pair()
    pair.send(Connect("dev1"), Publish("t", b"1"))
    pair.server.refuse(ReasonCode.BAD_USERNAME_OR_PASSWORD)
    assert pair.received() == [ConnAck(0x04, False)]
    assert pair.server.closed


def test_refused_connect_v5_gets_the_reason_code_and_string() -> None:
    pair = Pair(MQTT_50)
    pair.send(Connect("dev1", protocol_level=MQTT_50))
    pair.server.refuse(ReasonCode.NOT_AUTHORIZED, reason="bad key")
    [ack] = pair.received()
    assert isinstance(ack, ConnAck)
    assert ack.reason_code == ReasonCode.NOT_AUTHORIZED
    assert ack.properties.get_str(PropertyId.REASON_STRING) == "bad key"


def test_connack_v5_announces_the_server_limits() -> None:
    pair = Pair(MQTT_50, max_packet_size=4096, receive_maximum=100)
    pair.connect()
    [ack] = pair.received()
    assert isinstance(ack, ConnAck)
    assert ack.properties.get_int(PropertyId.MAXIMUM_PACKET_SIZE) == 4096
    assert ack.properties.get_int(PropertyId.RECEIVE_MAXIMUM) == 100
    assert ack.properties.get_int(PropertyId.RETAIN_AVAILABLE) == 0


def test_qos1_acks_wait_for_settlement_and_leave_in_arrival_order() -> None:
    pair = Pair()
    pair.connect()
    pair.received()
    t = tickets(pair.send(*(Publish("t", bytes([i]), 1, packet_id=10 + i) for i in range(3))))
    pair.server.settle(t[2])
    pair.server.settle(t[1])
    assert pair.received() == []  # the oldest is not durable yet, so nothing may go
    pair.server.settle(t[0])
    assert pair.received() == [PubAck(10), PubAck(11), PubAck(12)]
    assert pair.server.unsettled == 0


def test_settle_many_answers_a_group_in_arrival_order_whatever_order_it_is_given_in() -> None:
    pair = Pair(MQTT_50)
    pair.connect()
    pair.received()
    t = tickets(pair.send(*(Publish("t", bytes([i]), 1, packet_id=20 + i) for i in range(4))))
    pair.server.settle_many([(t[3], 0, None), (t[1], ReasonCode.QUOTA_EXCEEDED, "full")])
    assert pair.received() == []  # the first is still unanswered
    pair.server.settle_many([(t[2], 0, None), (t[0], 0, None)])
    acks = [a for a in pair.received() if isinstance(a, PubAck)]
    assert [(a.packet_id, a.reason_code) for a in acks] == [(20, 0), (21, 0x97), (22, 0), (23, 0)]
    assert pair.server.unsettled == 0


def test_settle_many_sends_what_was_due_before_a_misuse() -> None:
    pair = Pair()
    pair.connect()
    pair.received()
    t = tickets(pair.send(*(Publish("t", bytes([i]), 1, packet_id=30 + i) for i in range(2))))
    with pytest.raises(LocalProtocolError, match="unknown"):
        pair.server.settle_many([(t[0], 0, None), (9999, 0, None)])
    assert pair.received() == [PubAck(30)]
    with pytest.raises(LocalProtocolError, match="already settled"):
        pair.server.settle_many([(t[0], 0, None)])


def test_qos0_messages_have_no_ticket() -> None:
    pair = Pair()
    pair.connect()
    [event] = pair.send(Publish("t", b"x"))
    assert event == MessageReceived(Publish("t", b"x"), None)


def test_negative_settlement_is_a_negative_puback_in_mqtt5() -> None:
    pair = Pair(MQTT_50)
    pair.connect()
    pair.received()
    t = tickets(pair.send(Publish("t", b"a", 1, packet_id=1), Publish("t", b"b", 1, packet_id=2)))
    pair.server.settle(t[0], ReasonCode.QUOTA_EXCEEDED)
    pair.server.settle(t[1], ReasonCode.PACKET_TOO_LARGE)
    assert pair.received() == [PubAck(1, 0x97), PubAck(2, 0x95)]
    assert not pair.server.closed


def test_a_refusal_tells_an_mqtt5_client_why_in_the_reason_string() -> None:
    pair = Pair(MQTT_50)
    pair.connect()
    pair.received()
    t = tickets(pair.send(Publish("t", b"a", 1, packet_id=1), Publish("t", b"b", 2, packet_id=2)))
    pair.server.settle(t[0], ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, reason="sessionId and partitionKey differ")
    pair.server.settle(t[1], ReasonCode.QUOTA_EXCEEDED, reason="quota exceeded")
    first, second = pair.received()
    assert isinstance(first, PubAck)
    assert first.reason_code == 0x83
    assert first.properties.get_str(PropertyId.REASON_STRING) == "sessionId and partitionKey differ"
    assert isinstance(second, PubRec)
    assert second.properties.get_str(PropertyId.REASON_STRING) == "quota exceeded"


def test_no_reason_string_when_the_client_asked_for_no_problem_information() -> None:
    pair = Pair(MQTT_50)
    pair.connect(properties=Properties({PropertyId.REQUEST_PROBLEM_INFORMATION: 0}))
    pair.received()
    [t] = tickets(pair.send(Publish("t", b"a", 1, packet_id=1)))
    pair.server.settle(t, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, reason="why")
    assert pair.received() == [PubAck(1, 0x83)]


def test_no_reason_string_when_it_would_make_the_ack_too_large_for_the_client() -> None:
    pair = Pair(MQTT_50)
    pair.connect(properties=Properties({PropertyId.MAXIMUM_PACKET_SIZE: 16}))
    pair.received()
    [t] = tickets(pair.send(Publish("t", b"a", 1, packet_id=1)))
    pair.server.settle(t, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, reason="a reason far longer than sixteen bytes")
    assert pair.received() == [PubAck(1, 0x83)]


def test_a_successful_settlement_carries_no_reason_string() -> None:
    pair = Pair(MQTT_50)
    pair.connect()
    pair.received()
    [t] = tickets(pair.send(Publish("t", b"a", 1, packet_id=1)))
    pair.server.settle(t, ReasonCode.SUCCESS, reason="ignored")
    assert pair.received() == [PubAck(1)]


def test_negative_settlement_disconnects_a_v311_client_without_that_ack() -> None:
    pair = Pair()
    pair.connect()
    pair.received()
    t = tickets(pair.send(*(Publish("t", b"", 1, packet_id=i) for i in (1, 2, 3))))
    pair.server.settle(t[1], ReasonCode.NOT_AUTHORIZED)
    pair.server.settle(t[2])
    pair.server.settle(t[0])
    assert pair.received() == [PubAck(1)]
    assert pair.server.closed


def test_settling_after_close_is_harmless() -> None:
    pair = Pair()
    pair.connect()
    [t] = tickets(pair.send(Publish("t", b"", 1, packet_id=1)))
    pair.send(Disconnect())
    pair.server.settle(t)
    assert pair.server.closed


def test_settling_twice_is_a_local_error() -> None:
    pair = Pair()
    pair.connect()
    t = tickets(pair.send(Publish("t", b"", 1, packet_id=1), Publish("t", b"", 1, packet_id=2)))
    pair.server.settle(t[1])
    with pytest.raises(LocalProtocolError):
        pair.server.settle(t[1])


def test_qos2_is_delivered_once_and_completes_with_pubrel() -> None:
    pair = Pair(MQTT_50)
    pair.connect()
    pair.received()
    [t] = tickets(pair.send(Publish("t", b"x", 2, packet_id=7)))
    assert pair.send(Publish("t", b"x", 2, dup=True, packet_id=7)) == []  # resend before PUBREC: not delivered
    pair.server.settle(t)
    assert pair.received() == [PubRec(7)]
    assert pair.send(Publish("t", b"x", 2, dup=True, packet_id=7)) == []  # resend after PUBREC: PUBREC again
    assert pair.received() == [PubRec(7)]
    pair.send(PubRel(7))
    assert pair.received() == [PubComp(7)]
    # The packet id is free again: a new message with it is a new message.
    assert len(tickets(pair.send(Publish("t", b"y", 2, packet_id=7)))) == 1


def test_pubrel_for_an_unknown_packet_id_is_answered_not_found() -> None:
    pair = Pair(MQTT_50)
    pair.connect()
    pair.received()
    pair.send(PubRel(99))
    assert pair.received() == [PubComp(99, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)]


def test_receive_maximum_exceeded_closes_with_0x93() -> None:
    pair = Pair(MQTT_50, receive_maximum=2)
    pair.connect()
    pair.received()
    events = pair.send(*(Publish("t", b"", 1, packet_id=i) for i in (1, 2, 3)))
    assert isinstance(events[-1], ProtocolFailed)
    assert pair.received() == [Disconnect(0x93)]


def test_oversized_packet_closes_a_v5_client_with_0x95() -> None:
    pair = Pair(MQTT_50, max_packet_size=64)
    pair.connect()
    pair.received()
    [event] = pair.send(Publish("t", b"x" * 100))
    assert isinstance(event, ProtocolFailed)
    assert pair.received() == [Disconnect(ReasonCode.PACKET_TOO_LARGE)]
    assert pair.server.closed


def test_topic_aliases_resolve_and_bad_ones_close() -> None:
    pair = Pair(MQTT_50)
    pair.connect()
    alias = Properties({PropertyId.TOPIC_ALIAS: 3})
    [_, b] = pair.send(Publish("long/topic", b"1", properties=alias), Publish("", b"2", properties=alias))
    assert isinstance(b, MessageReceived)
    assert b.publish.topic == "long/topic"
    pair.received()
    [bad] = pair.send(Publish("", b"3", properties=Properties({PropertyId.TOPIC_ALIAS: 4})))
    assert isinstance(bad, ProtocolFailed)


def test_subscribe_and_unsubscribe_are_answered_by_the_server() -> None:
    pair = Pair()
    pair.connect()
    pair.received()
    [sub] = pair.send(Subscribe(3, (Subscription("devices/dev1/messages/devicebound/#", 1), Subscription("x", 1))))
    assert isinstance(sub, SubscribeRequested)
    pair.server.answer_subscribe(3, (1, ReasonCode.NOT_AUTHORIZED))
    [unsub] = pair.send(Unsubscribe(4, ("x",)))
    assert isinstance(unsub, UnsubscribeRequested)
    pair.server.answer_unsubscribe(4, (0,))
    assert pair.received() == [SubAck(3, (1, 0x80)), UnsubAck(4)]


def test_outbound_window_limits_inflight_and_pubacks_free_it() -> None:
    pair = Pair(outbound_window=2)
    pair.connect()
    pair.received()
    ids = [pair.server.send_message("in", b"a"), pair.server.send_message("in", b"b")]
    assert pair.server.window_free == 0
    with pytest.raises(LocalProtocolError):
        pair.server.send_message("in", b"c")
    got = pair.received()
    assert [p.payload for p in got if isinstance(p, Publish)] == [b"a", b"b"]
    assert ids[0] is not None
    assert pair.send(PubAck(ids[0])) == [DeliveryAcked(ids[0], 0)]
    assert pair.server.window_free == 1
    assert list(pair.server.inflight()) == [ids[1]]


def test_a_closed_connection_has_no_window_and_refuses_a_send() -> None:
    pair = Pair(outbound_window=4)
    pair.connect()
    pair.received()
    pair.server.send_message("in", b"a")
    assert pair.server.window_free == 3
    pair.server.close()
    assert pair.server.window_free == 0  # the hub's pump asks this alone before it sends
    with pytest.raises(LocalProtocolError, match="send_message in state closed"):
        pair.server.send_message("in", b"b")


def test_a_read_of_plain_pubacks_settles_deliveries_without_events() -> None:
    pair = Pair(MQTT_50, outbound_window=4)
    assert pair.server.receive_acks(b"\x40\x02\x00\x01") is None  # not connected yet
    pair.connect()
    pair.received()
    ids = [pair.server.send_message("in", bytes([i]), qos=1) or 0 for i in range(3)]
    assert 0 not in ids  # packet ids start at 1
    wire = b"".join(encode(PubAck(i), MQTT_50) for i in [ids[1], 999, ids[0]])  # 999 was never sent
    assert pair.server.receive_acks(wire) == [ids[1], ids[0]]
    assert list(pair.server.inflight()) == [ids[2]]
    assert pair.server.window_free == 3
    refused = encode(PubAck(ids[2], 0x80), MQTT_50)  # a reason code: the general way, as an event
    assert pair.server.receive_acks(refused) is None
    assert pair.server.receive_data(refused) == [DeliveryAcked(ids[2], 0x80)]


def test_client_receive_maximum_narrows_the_outbound_window() -> None:
    pair = Pair(MQTT_50, outbound_window=16)
    pair.connect(properties=Properties({PropertyId.RECEIVE_MAXIMUM: 3}))
    assert pair.server.window_free == 3


def test_unacked_messages_are_redelivered_with_dup_on_a_new_connection() -> None:
    first = Pair()
    first.connect()
    pid = first.server.send_message("devices/d/modules/m/inputs/i/", b"payload")
    inflight = first.server.inflight()
    second = Pair()
    second.connect(clean_start=False)
    second.received()
    second.server.resume(inflight)
    [again] = second.received()
    assert again == Publish("devices/d/modules/m/inputs/i/", b"payload", 1, False, True, pid)
    assert pid is not None
    assert second.send(PubAck(pid)) == [DeliveryAcked(pid, 0)]


def test_outbound_qos2_is_refused_locally() -> None:
    pair = Pair()
    pair.connect()
    with pytest.raises(LocalProtocolError):
        pair.server.send_message("t", b"", qos=2)


def test_ping_is_answered() -> None:
    pair = Pair()
    pair.connect()
    pair.received()
    pair.send(PingReq())
    assert pair.received() == [PingResp()]


def test_disconnect_with_will_reason_asks_for_the_will() -> None:
    pair = Pair(MQTT_50)
    pair.connect()
    [event] = pair.send(Disconnect(ReasonCode.DISCONNECT_WITH_WILL))
    assert event == Disconnected(0x04, True, None)
    assert pair.server.closed


def test_server_close_tells_a_v5_client_why() -> None:
    pair = Pair(MQTT_50)
    pair.connect()
    pair.received()
    pair.server.close(ReasonCode.SESSION_TAKEN_OVER)
    assert pair.received() == [Disconnect(ReasonCode.SESSION_TAKEN_OVER)]


def test_second_connect_is_a_protocol_error() -> None:
    pair = Pair()
    pair.connect()
    [event] = pair.send(Connect("again"))
    assert isinstance(event, ProtocolFailed)


def test_unsupported_protocol_level_gets_connack_0x01() -> None:
    server = ServerConnection()
    wire = b"\x10\x0d\x00\x04MQTT\x03\x02\x00\x3c\x00\x01c"
    [event] = server.receive_data(wire)
    assert isinstance(event, ProtocolFailed)
    assert server.data_to_send() == b"\x20\x02\x00\x01"


def test_the_table_has_no_way_out_of_closed_but_settling_and_closing() -> None:
    assert set(TRANSITIONS[ConnectionState.CLOSED].values()) == {ConnectionState.CLOSED}


def test_the_rows_the_connection_reads_say_what_the_table_says() -> None:
    # ROWS is the table keyed also by packet class (one look-up per packet): it must add nothing and drop nothing.
    for state in ConnectionState:
        row = ROWS[state]
        for trigger in Trigger:
            assert row.get(trigger) is TRANSITIONS[state].get(trigger)
        for cls, trigger in TRIGGER_OF.items():
            assert row.get(cls) is TRANSITIONS[state].get(trigger)
        assert len(row) == len(TRANSITIONS[state]) + sum(t in TRANSITIONS[state] for t in TRIGGER_OF.values())


def test_packet_ids_wrap_after_65535_and_skip_ids_still_in_flight() -> None:
    pair = Pair(outbound_window=2)
    pair.connect()
    held = pair.server.send_message("in", b"kept")  # never acked
    assert held == 1
    for expected in range(2, 0x10000):
        pid = pair.server.send_message("in", b"x")
        assert pid == expected
        pair.server.receive_data(encode(PubAck(pid), 4))
    assert pair.server.send_message("in", b"y") == 2  # 65535 wraps to 1, which is still in flight
    assert list(pair.server.inflight()) == [1, 2]


def test_a_client_receive_maximum_over_the_window_leaves_the_window() -> None:
    pair = Pair(MQTT_50, outbound_window=4)
    pair.connect(properties=Properties({PropertyId.RECEIVE_MAXIMUM: 100}))
    assert pair.server.window_free == 4


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.sampled_from([4, MQTT_50]))
def test_any_bytes_after_connect_give_events_never_exceptions(data: bytes, level: int) -> None:
    pair = Pair(level)
    pair.connect()
    events = pair.server.receive_data(data)
    for event in events:
        if isinstance(event, MessageReceived) and event.ticket is not None:
            pair.server.settle(event.ticket, ReasonCode.QUOTA_EXCEEDED)
    if any(isinstance(e, ProtocolFailed) for e in events):
        assert pair.server.closed
    pair.server.data_to_send()


def test_connack_v5_never_announces_maximum_qos_2() -> None:
    pair = Pair(MQTT_50)
    pair.connect()
    [ack] = pair.received()
    assert isinstance(ack, ConnAck)
    assert PropertyId.MAXIMUM_QOS not in ack.properties.values


def test_retained_publish_closes_a_v5_client_with_0x9a_and_is_ignored_for_v311() -> None:
    v5 = Pair(MQTT_50)
    v5.connect()
    v5.received()
    [failed] = v5.send(Publish("t", b"", retain=True))
    assert isinstance(failed, ProtocolFailed)
    assert v5.received() == [Disconnect(ReasonCode.RETAIN_NOT_SUPPORTED)]
    v3 = Pair()
    v3.connect()
    [event] = v3.send(Publish("t", b"", retain=True))
    assert isinstance(event, MessageReceived)
