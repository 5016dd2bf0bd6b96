"""Fuzzing the AMQP head's frame path (``AmqpConnection``: our SASL layer, then proton's engine): random bytes,
a real client session (SASL PLAIN, open, begin, attach, transfers, detach, close, as proton's client sends it)
mutated and split anywhere. Whatever arrives, ``receive_data`` never raises, a failure closes the connection
with an error condition that goes out, and nothing is accepted after it."""

from __future__ import annotations

import functools
import itertools

from hypothesis import given
from hypothesis import strategies as st
from proton import Connection, Transport
from proton import Message as AmqpMessage

from protocol_heads.amqp import events as ev
from protocol_heads.amqp.connection import AmqpConnection
from protocol_heads.amqp.sasl import SaslCode
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.mqtt_inputs import mutated, split


def server(*, max_frame_size: int = 4096) -> AmqpConnection:
    return AmqpConnection(
        mechanisms=("PLAIN", "ANONYMOUS"),
        max_frame_size=max_frame_size,
        max_sessions=4,
        max_links=4,
        max_message_size=1024,
        idle_timeout_s=60.0,
    )


def drive(conn: AmqpConnection, chunks: list[bytes]) -> list[ev.Event]:
    """Feed ``chunks`` as reads, answering as the session side would: SASL OK, links accepted, transfers
    settled. Returns every event; checks the invariants on the way."""
    seen: list[ev.Event] = []
    for chunk in chunks:
        events = conn.receive_data(chunk)
        while events:
            event = events.pop(0)
            seen.append(event)
            if isinstance(event, ev.SaslInitReceived):
                events.extend(conn.sasl_outcome(SaslCode.OK))
            elif isinstance(event, ev.LinkRequested):
                conn.accept_link(event.link, credit=10)
            elif isinstance(event, ev.MessageReceived) and not event.settled:
                conn.settle(event.delivery)
        out = conn.data_to_send()
        assert isinstance(out, bytes)
        if any(isinstance(e, ev.ProtocolFailed) for e in seen):
            assert conn.closed
    if any(isinstance(e, ev.ProtocolFailed) for e in seen):
        failed_at = next(i for i, e in enumerate(seen) if isinstance(e, ev.ProtocolFailed))
        assert not any(isinstance(e, ev.MessageReceived) for e in seen[failed_at + 1 :])
    conn.discard()
    return seen


def client_session() -> bytes:
    return b"".join(client_reads())


def as_reads(wire: bytes, extra_cuts: list[bytes]) -> list[bytes]:
    """``wire`` (the recorded session, perhaps mutated) cut where the client's own writes ended, and further
    where ``extra_cuts`` cut it: a real client sends its transfers only after our answers, so the reads must not
    run into each other (proton would rightly call transfers before our flow a window violation)."""
    reads, at = [], 0
    ends = list(itertools.accumulate(len(c) for c in client_reads()))
    cuts = sorted({*ends, *itertools.accumulate(len(c) for c in extra_cuts)})
    for end in cuts:
        if end > at:
            reads.append(wire[at:end])
            at = end
    if at < len(wire):
        reads.append(wire[at:])
    return reads


@functools.cache
def client_reads() -> tuple[bytes, ...]:
    """What proton's client sends in a whole session against our server, write by write (recorded once)."""
    client = Transport(Transport.CLIENT)
    cc = Connection()
    cc.user, cc.password = "dev1@sas.hub", "SharedAccessSignature sr=x"
    sasl = client.sasl()
    sasl.allowed_mechs("PLAIN")
    sasl.allow_insecure_mechs = True
    cc.container = "fuzz"
    cc.open()
    client.bind(cc)
    ssn = cc.session()
    ssn.open()
    snd = ssn.sender("s")
    snd.target.address = "/devices/dev1/messages/events"
    snd.open()
    conn = server()
    wire: list[bytes] = []
    sent = False
    for _ in range(20):
        pending = client.pending()
        if pending > 0:
            chunk = bytes(client.peek(pending))
            client.pop(len(chunk))
            wire.append(chunk)
            for event in conn.receive_data(chunk):
                if isinstance(event, ev.SaslInitReceived):
                    conn.sasl_outcome(SaslCode.OK)
                elif isinstance(event, ev.LinkRequested):
                    conn.accept_link(event.link, credit=10)
        back = conn.data_to_send()
        if back:
            client.push(back)
        if snd.credit > 0 and not sent:
            for n in range(3):
                snd.delivery(str(n))
                snd.send(AmqpMessage(body=b"x" * n, id=str(n), properties={"k": "v"}).encode())
                snd.advance()
            snd.close()
            ssn.close()
            cc.close()
            sent = True
    assert sent, "the recorded session never got link credit"
    return tuple(wire)


def test_the_recorded_session_is_a_real_one() -> None:
    # Not vacuous: unmutated, it logs in, attaches, and three transfers arrive whole.
    events = drive(server(), list(client_reads()))
    assert sum(isinstance(e, ev.MessageReceived) for e in events) == 3
    assert not any(isinstance(e, ev.ProtocolFailed) for e in events)


def test_a_frame_over_max_frame_size_fails_the_connection_with_framing_error() -> None:
    wire = client_session()
    conn = server()
    big = b"\x00\x10\x00\x00\x02\x00\x00\x00" + b"\x00" * 64  # a 1 MiB frame announced, over 4096
    events = drive_open(conn, wire[: _sasl_end(wire)] + b"AMQP\x00\x01\x00\x00" + big)
    failed = [e for e in events if isinstance(e, ev.ProtocolFailed)]
    assert [e.condition for e in failed] == ["amqp:connection:framing-error"]
    assert conn.closed


def test_a_client_without_sasl_reaches_the_amqp_layer_where_anonymous_is_offered() -> None:
    # As the Azure SDKs open: no SASL layer, a CBS token to come (the session side gates every other link).
    conn = server()
    events = conn.receive_data(b"AMQP\x00\x01\x00\x00")
    assert not any(isinstance(e, ev.ProtocolFailed) for e in events)
    assert conn.data_to_send().startswith(b"AMQP\x00\x01\x00\x00")  # proton's engine answers with its header
    assert not conn.closed
    assert conn.before_login


def test_a_client_without_sasl_is_told_sasl_is_required_where_anonymous_is_not_offered() -> None:
    conn = AmqpConnection(
        mechanisms=("EXTERNAL", "PLAIN"),
        max_frame_size=4096,
        max_sessions=4,
        max_links=4,
        max_message_size=1024,
        idle_timeout_s=60.0,
    )
    events = conn.receive_data(b"AMQP\x00\x01\x00\x00")
    assert isinstance(events[-1], ev.ProtocolFailed)
    assert conn.data_to_send() == b"AMQP\x03\x01\x00\x00"  # the header we speak, then the end
    assert conn.closed


def drive_open(conn: AmqpConnection, wire: bytes) -> list[ev.Event]:
    """``drive`` without its discard: the connection stays to be looked at."""
    seen: list[ev.Event] = []
    events = conn.receive_data(wire)
    while events:
        event = events.pop(0)
        seen.append(event)
        if isinstance(event, ev.SaslInitReceived):
            events.extend(conn.sasl_outcome(SaslCode.OK))
    conn.data_to_send()
    return seen


@fuzz_settings(150)
@given(st.lists(st.binary(max_size=96), max_size=6))
def test_random_bytes_never_raise(chunks: list[bytes]) -> None:
    drive(server(), chunks)


@fuzz_settings(150)
@given(st.lists(st.binary(max_size=96), max_size=6))
def test_random_bytes_after_sasl_never_raise(chunks: list[bytes]) -> None:
    # Past our SASL layer, into proton's frame decoder.
    wire = client_session()
    drive(server(), [wire[: _sasl_end(wire)] + b"AMQP\x00\x01\x00\x00", *chunks])


@fuzz_settings(150)
@given(st.lists(st.binary(max_size=96), max_size=6))
def test_random_bytes_after_a_plain_amqp_header_never_raise(chunks: list[bytes]) -> None:
    # No SASL layer (as the Azure SDKs open): straight into proton's frame decoder, before any login.
    drive(server(), [b"AMQP\x00\x01\x00\x00", *chunks])


@fuzz_settings(250)
@given(st.data())
def test_a_real_session_mutated_and_split_never_raises(data: st.DataObject) -> None:
    wire = data.draw(mutated(client_session()))
    reads = as_reads(wire, data.draw(split(wire)))
    drive(server(max_frame_size=data.draw(st.sampled_from([512, 4096]))), reads)


@fuzz_settings(100)
@given(st.data())
def test_a_real_session_split_anywhere_delivers_the_same_transfers(data: st.DataObject) -> None:
    wire = client_session()
    events = drive(server(), as_reads(wire, data.draw(split(wire))))
    assert [e.body for e in events if isinstance(e, ev.MessageReceived)] == [
        e.body for e in drive(server(), list(client_reads())) if isinstance(e, ev.MessageReceived)
    ]


def _sasl_end(wire: bytes) -> int:
    """Where the client's SASL bytes end (header plus the sasl-init frame)."""
    size = int.from_bytes(wire[8:12], "big")
    return 8 + size
