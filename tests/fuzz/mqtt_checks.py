"""The properties the MQTT codec and connection must keep on any input; the tests in this folder and
``python -m bench.fuzz`` run them (the bench for minutes, with atheris too where it installs).

* The decoder raises only its declared errors (``MalformedPacket``, ``ProtocolViolation``, ``PacketTooLarge``:
  ``RemoteProtocolError``s with an MQTT 5 reason code), and after one it stays dead.
* Bytes split at any points across reads decode to the same packets as in one read.
* ``ServerConnection.receive_data`` never raises: a broken client ends in a ``ProtocolFailed`` event (its last
  event), the connection CLOSED, and whatever the server sent decodes cleanly on the client's side.
"""

from __future__ import annotations

import pytest

from edgehub.core import RemoteProtocolError
from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import MalformedPacket, Packet, PacketTooLarge, ProtocolViolation, ReasonCode
from protocol_heads.mqtt.connection import (
    ConnectionState,
    ConnectRequested,
    DeliveryAcked,
    Disconnected,
    Event,
    MessageReceived,
    PeerPacketTooLarge,
    ProtocolFailed,
    ServerConnection,
    SubscribeRequested,
    UnsubscribeRequested,
)

__all__ = ["DECLARED", "check_connection", "check_decoder", "check_round_trip", "decode_all"]

DECLARED = (MalformedPacket, ProtocolViolation, PacketTooLarge)


def decode_all(
    chunks: list[bytes], level: int | None, max_packet_size: int = 1 << 20
) -> list[Packet] | RemoteProtocolError:
    """The packets of ``chunks`` fed read by read, or the declared error the decoder raised."""
    d = Decoder(protocol_level=level, max_packet_size=max_packet_size)
    out: list[Packet] = []
    for chunk in chunks:
        try:
            out += d.receive_data(chunk)
        except DECLARED as exc:
            error: RemoteProtocolError = exc
            break
    else:
        return out
    if error.reason_code is None:
        raise AssertionError(f"{error!r} carries no reason code")
    # Dead after an error: a broken stream cannot be resynchronised.
    with pytest.raises(type(error)):
        d.receive_data(b"\xc0\x00")
    return error


def check_decoder(chunks: list[bytes], level: int | None, max_packet_size: int = 1 << 20) -> None:
    """Only declared errors come out, and the reads' boundaries do not change the outcome."""
    split_outcome = decode_all(chunks, level, max_packet_size)
    whole = decode_all([b"".join(chunks)], level, max_packet_size)
    if isinstance(whole, RemoteProtocolError):
        # The packets before the error may have come out in earlier reads; the error itself must be the same.
        assert isinstance(split_outcome, RemoteProtocolError), (whole, split_outcome)
        assert (type(split_outcome), split_outcome.reason_code) == (type(whole), whole.reason_code)
    else:
        assert split_outcome == whole


def check_round_trip(packet: Packet, level: int) -> None:
    """``decode(encode(p)) == p`` and, for the bytes ``encode`` gives, ``encode(decode(x)) == x``."""
    wire = encode(packet, level)
    decoder_level = None if type(packet).__name__ == "Connect" else level
    got = Decoder(protocol_level=decoder_level).receive_data(wire)
    assert got == [packet], (got, packet)
    assert encode(got[0], level) == wire


def check_connection(chunks: list[bytes], *, settle_code: int = 0, refuse: bool = False) -> list[Event]:
    """Feed ``chunks`` to a server connection, answering as a server would; it must never raise. Returns the
    events, for tests that want more."""
    conn = ServerConnection(max_packet_size=4096, receive_maximum=8, topic_alias_maximum=4)
    events: list[Event] = []
    client: Decoder | None = None
    for chunk in chunks:
        was_closed = conn.closed
        got = conn.receive_data(chunk)
        if was_closed:
            assert got == []
        pending = list(got)
        while pending:
            event = pending.pop(0)
            events.append(event)
            if isinstance(event, ProtocolFailed):
                assert conn.closed
                assert not pending, "ProtocolFailed must be the last event"
                assert isinstance(event.error, RemoteProtocolError)
            elif isinstance(event, ConnectRequested):
                if refuse:
                    conn.refuse(ReasonCode.NOT_AUTHORIZED)
                else:
                    pending[:0] = conn.accept()
                    if not conn.closed and conn.window_free:
                        try:
                            conn.send_message("devices/d/messages/devicebound/", b"x", qos=1)
                        except PeerPacketTooLarge:
                            pass  # the client announced a Maximum Packet Size smaller than this delivery
            elif isinstance(event, MessageReceived):
                if event.ticket is not None:
                    conn.settle(event.ticket, settle_code)
            elif isinstance(event, SubscribeRequested) and conn.state is ConnectionState.CONNECTED:
                conn.answer_subscribe(event.subscribe.packet_id, [1] * len(event.subscribe.subscriptions))
            elif isinstance(event, UnsubscribeRequested) and conn.state is ConnectionState.CONNECTED:
                conn.answer_unsubscribe(event.unsubscribe.packet_id, [0] * len(event.unsubscribe.topic_filters))
            else:
                assert isinstance(event, DeliveryAcked | Disconnected | SubscribeRequested | UnsubscribeRequested)
        out = conn.data_to_send()
        if out:
            # What the server says must be MQTT the client can read, at the level the connection runs.
            if client is None:
                client = Decoder(protocol_level=conn.protocol_level)
            client.receive_data(out)
    if any(isinstance(e, ProtocolFailed) for e in events):
        assert conn.closed
    return events
