"""Hypothesis strategies for the MQTT codec and connection: valid packets of every type for MQTT 3.1.1 and 5.0
(with properties), client sessions, mutations of their bytes and splits across reads.

A generated packet is one the codec promises to round-trip at its level: ``decode(encode(p)) == p``. So 3.1.1
packets carry no properties and no reason codes where 3.1.1 has none, a QoS 0 PUBLISH has no DUP, and strings
have no U+0000 (which MQTT forbids).
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import (
    MAX_VARINT,
    MQTT_50,
    MQTT_311,
    Auth,
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
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)

__all__ = [
    "client_packets",
    "client_session",
    "levels",
    "mutated",
    "packets",
    "session_bytes",
    "split",
]

levels = st.sampled_from([MQTT_311, MQTT_50])
texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
topics = st.text(st.characters(codec="utf-8", exclude_characters="\x00+#"), min_size=1, max_size=24)
packet_ids = st.integers(1, 0xFFFF)
bytes_ = st.binary(max_size=24)

_KIND_VALUES: dict[str, st.SearchStrategy[int | str | bytes]] = {
    "b": st.integers(0, 0xFF),
    "h": st.integers(0, 0xFFFF),
    "i": st.integers(0, 0xFFFF_FFFF),
    "v": st.integers(0, MAX_VARINT),
    "s": texts,
    "d": bytes_,
}
# Same table as the codec's, written out again so that a wrong entry there is not copied here.
_KINDS = {
    PropertyId.PAYLOAD_FORMAT_INDICATOR: "b",
    PropertyId.MESSAGE_EXPIRY_INTERVAL: "i",
    PropertyId.CONTENT_TYPE: "s",
    PropertyId.RESPONSE_TOPIC: "s",
    PropertyId.CORRELATION_DATA: "d",
    PropertyId.SUBSCRIPTION_IDENTIFIER: "v",
    PropertyId.SESSION_EXPIRY_INTERVAL: "i",
    PropertyId.ASSIGNED_CLIENT_IDENTIFIER: "s",
    PropertyId.SERVER_KEEP_ALIVE: "h",
    PropertyId.AUTHENTICATION_METHOD: "s",
    PropertyId.AUTHENTICATION_DATA: "d",
    PropertyId.REQUEST_PROBLEM_INFORMATION: "b",
    PropertyId.WILL_DELAY_INTERVAL: "i",
    PropertyId.REQUEST_RESPONSE_INFORMATION: "b",
    PropertyId.RESPONSE_INFORMATION: "s",
    PropertyId.SERVER_REFERENCE: "s",
    PropertyId.REASON_STRING: "s",
    PropertyId.RECEIVE_MAXIMUM: "h",
    PropertyId.TOPIC_ALIAS_MAXIMUM: "h",
    PropertyId.TOPIC_ALIAS: "h",
    PropertyId.MAXIMUM_QOS: "b",
    PropertyId.RETAIN_AVAILABLE: "b",
    PropertyId.MAXIMUM_PACKET_SIZE: "i",
    PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE: "b",
    PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE: "b",
    PropertyId.SHARED_SUBSCRIPTION_AVAILABLE: "b",
}


@st.composite
def properties(draw: st.DrawFn, level: int) -> Properties:
    if level != MQTT_50:
        return Properties()
    ids = draw(st.lists(st.sampled_from(sorted(_KINDS)), max_size=4, unique=True))
    values = {pid: draw(_KIND_VALUES[_KINDS[pid]]) for pid in ids}
    user = draw(st.lists(st.tuples(texts, texts), max_size=3))
    return Properties(values, tuple(user))


@st.composite
def _connect(draw: st.DrawFn, level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(draw(topics), draw(bytes_), draw(st.integers(0, 2)), draw(st.booleans()), draw(properties(level)))
    username = draw(st.none() | texts)
    # 3.1.1 has no password without a username [MQTT-3.1.2-22].
    password = draw(st.none() | bytes_) if username is not None or level == MQTT_50 else None
    return Connect(
        draw(texts),
        level,
        draw(st.integers(0, 0xFFFF)),
        draw(st.booleans()),
        username,
        password,
        will,
        draw(properties(level)),
    )


@st.composite
def _publish(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    return Publish(
        draw(topics),
        draw(st.binary(max_size=200)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(packet_ids) if qos else None,
        draw(properties(level)),
    )


@st.composite
def _ack(draw: st.DrawFn, level: int, kind: type[PubAck | PubRec | PubRel | PubComp]) -> Packet:
    if level != MQTT_50:
        return kind(draw(packet_ids))
    return kind(draw(packet_ids), draw(st.integers(0, 0xFF)), draw(properties(level)))


@st.composite
def _subscribe(draw: st.DrawFn, level: int) -> Subscribe:
    subs = []
    for _ in range(draw(st.integers(1, 3))):
        if level == MQTT_50:
            subs.append(
                Subscription(
                    draw(texts),
                    draw(st.integers(0, 2)),
                    draw(st.booleans()),
                    draw(st.booleans()),
                    draw(st.integers(0, 2)),
                )
            )
        else:
            subs.append(Subscription(draw(texts), draw(st.integers(0, 2))))
    return Subscribe(draw(packet_ids), tuple(subs), draw(properties(level)))


@st.composite
def _reason_and_properties(draw: st.DrawFn, level: int, kind: type[Disconnect | Auth]) -> Packet:
    if level != MQTT_50:
        return kind()
    return kind(draw(st.integers(0, 0xFF)), draw(properties(level)))


def packets(level: int) -> st.SearchStrategy[Packet]:
    """Any packet, either direction, valid at ``level``."""
    v5 = level == MQTT_50
    codes = st.lists(st.integers(0, 0xFF), min_size=1, max_size=4).map(tuple)
    options: list[st.SearchStrategy[Packet]] = [
        _connect(level),
        st.builds(ConnAck, st.integers(0, 0xFF), st.booleans(), properties(level)),
        _publish(level),
        _ack(level, PubAck),
        _ack(level, PubRec),
        _ack(level, PubRel),
        _ack(level, PubComp),
        _subscribe(level),
        st.builds(SubAck, packet_ids, codes, properties(level)),
        st.builds(Unsubscribe, packet_ids, st.lists(texts, min_size=1, max_size=3).map(tuple), properties(level)),
        st.builds(UnsubAck, packet_ids, codes if v5 else st.just(()), properties(level)),
        st.just(PingReq()),
        st.just(PingResp()),
        _reason_and_properties(level, Disconnect),
    ]
    if v5:
        options.append(_reason_and_properties(level, Auth))
    return st.one_of(options)


def client_packets(level: int) -> st.SearchStrategy[Packet]:
    """What a client sends after CONNECT, mostly PUBLISHes, with now and then a packet it must not send."""
    return st.one_of(
        _publish(level),
        _publish(level),
        _ack(level, PubAck),
        _ack(level, PubRel),
        _subscribe(level),
        st.builds(Unsubscribe, packet_ids, st.lists(texts, min_size=1, max_size=3).map(tuple), properties(level)),
        st.just(PingReq()),
        _reason_and_properties(level, Disconnect),
        packets(level),  # a CONNACK, a SUBACK, a second CONNECT ...
    )


@st.composite
def client_session(draw: st.DrawFn) -> tuple[int, list[Packet]]:
    """A CONNECT and what the client sends after it, at one level."""
    level = draw(levels)
    return level, [draw(_connect(level)), *draw(st.lists(client_packets(level), max_size=8))]


# Packets a client must not send and ``encode`` cannot make: packet identifier 0 where one is required.
_ZERO_ID = [
    b"\x82\x08\x00\x00\x00\x03a/b\x01",  # SUBSCRIBE (3.1.1)
    b"\x82\x09\x00\x00\x00\x00\x03a/b\x01",  # SUBSCRIBE (5.0)
    b"\xa2\x07\x00\x00\x00\x03a/b",  # UNSUBSCRIBE (3.1.1)
    b"\x62\x02\x00\x00",  # PUBREL
    b"\x40\x02\x00\x00",  # PUBACK
    b"\x32\x05\x00\x01t\x00\x00",  # PUBLISH QoS 1
]


@st.composite
def session_bytes(draw: st.DrawFn) -> bytes:
    """A client session's bytes: its packets encoded, now and then one it must not send between them."""
    level, packets = draw(client_session())
    wires = [encode(p, level) for p in packets]
    for _ in range(draw(st.integers(0, 2))):
        wires.insert(draw(st.integers(1, len(wires))), draw(st.sampled_from(_ZERO_ID)))
    return b"".join(wires)


@st.composite
def mutated(draw: st.DrawFn, wire: bytes) -> bytes:
    """``wire`` with a few bytes changed, inserted, deleted or cut off at the end."""
    out = bytearray(wire)
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["set", "insert", "delete", "truncate", "flip"]))
        i = draw(st.integers(0, max(0, len(out) - 1)))
        if how == "set" and out:
            out[i] = draw(st.integers(0, 0xFF))
        elif how == "flip" and out:
            out[i] ^= 1 << draw(st.integers(0, 7))
        elif how == "insert":
            out[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif how == "delete" and out:
            del out[i]
        elif how == "truncate":
            del out[i:]
    return bytes(out)


@st.composite
def split(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut at a few random points, as the reads of a socket."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]
