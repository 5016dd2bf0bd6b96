"""An incoming link's bound, sans-IO (``AmqpConnection`` wired to proton's own client in memory): each link is
told, at attach, what ``link_message_size`` says then, and keeps it; a transfer past it is refused with at most one
frame more of it read, however many frames one read brings (a fast client fills the socket buffer), what comes of
it after is dropped as it comes, and once it has ended its link is closed with ``amqp:link:message-size-exceeded``
while the connection goes on."""

from __future__ import annotations

from dataclasses import dataclass, field

from proton import Connection, Endpoint, Link, Sender, Transport
from proton import Message as AmqpMessage

from protocol_heads.amqp import events as ev
from protocol_heads.amqp.connection import AmqpConnection
from protocol_heads.amqp.sasl import SaslCode

FRAME = 4096  # the server's max-frame-size: small, so a message takes many frames
CAP = 1 << 20  # the head's own max_message_size


@dataclass
class Bound:
    """The deployment's side of the seam, as the store's ``largest_message_size_bytes`` would answer: steerable."""

    now: int

    def __call__(self) -> int:
        return self.now


@dataclass
class Pair:
    """Proton's client and our server connection, bytes moved between them by ``pump``; every server event kept,
    every read the server got kept (its size says how much one read brought)."""

    bound: Bound
    server: AmqpConnection = field(init=False)
    client: Transport = field(default_factory=lambda: Transport(Transport.CLIENT))
    conn: Connection = field(default_factory=Connection)
    events: list[ev.Event] = field(default_factory=list)
    reads: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = AmqpConnection(
            mechanisms=("PLAIN",),
            max_frame_size=FRAME,
            max_sessions=4,
            max_links=4,
            max_message_size=CAP,
            idle_timeout_s=60.0,
            link_message_size=self.bound,
        )
        self.conn.user, self.conn.password = "dev1@sas.hub", "SharedAccessSignature sr=x"
        sasl = self.client.sasl()
        sasl.allowed_mechs("PLAIN")
        sasl.allow_insecure_mechs = True
        self.conn.open()
        self.client.bind(self.conn)

    def pump(self, turns: int = 50) -> None:
        """Move bytes both ways, each way all at once, answering as the session side does (SASL OK, logged in, links
        accepted with credit, whole transfers settled), until neither side has anything to say."""
        for _ in range(turns):
            chunk = b""
            while (pending := self.client.pending()) > 0:  # all the client has: one read
                chunk += bytes(self.client.peek(pending))
                self.client.pop(pending)
            moved = False
            if chunk:
                self.reads.append(len(chunk))
                self._answer(self.server.receive_data(chunk))
                moved = True
            back = self.server.data_to_send()
            if back:
                self.client.push(back)
                moved = True
            if not moved:
                return

    def _answer(self, events: list[ev.Event]) -> None:
        while events:
            event = events.pop(0)
            self.events.append(event)
            if isinstance(event, ev.SaslInitReceived):
                self.server.logged_in()  # as the session side says once PLAIN's credentials are checked
                events.extend(self.server.sasl_outcome(SaslCode.OK))
            elif isinstance(event, ev.LinkRequested):
                self.server.accept_link(event.link, credit=10)
            elif isinstance(event, ev.MessageReceived) and not event.settled:
                self.server.settle(event.delivery)

    def sender(self, name: str) -> Sender:
        ssn = self.conn.session()
        ssn.open()
        snd = ssn.sender(name)
        snd.target.address = "/devices/dev1/messages/events"
        snd.open()
        self.pump()
        assert snd.credit > 0
        return snd

    def send(self, snd: Sender, body: bytes) -> None:
        snd.delivery(f"d{len(self.events)}")
        snd.send(AmqpMessage(body=body).encode())
        snd.advance()
        self.pump()

    def received(self) -> list[bytes]:
        return [e.body for e in self.events if isinstance(e, ev.MessageReceived)]

    def too_large(self) -> list[ev.MessageTooLarge]:
        return [e for e in self.events if isinstance(e, ev.MessageTooLarge)]


def held_by_proton(server: AmqpConnection) -> int:
    """The bytes of incoming transfers proton holds over the connection's sessions."""
    assert server.connection is not None
    total, session = 0, server.connection.session_head(0)
    while session is not None:
        total += session.incoming_bytes
        session = session.next(0)
    return total


def closed_with(link: Link) -> str | None:
    if not link.state & Endpoint.REMOTE_CLOSED or link.remote_condition is None:
        return None
    return str(link.remote_condition.name)


def test_each_link_is_told_the_bound_at_its_attach_and_keeps_it() -> None:
    pair = Pair(Bound(8 * 1024))
    first = pair.sender("first")
    assert first.remote_max_message_size == 8 * 1024
    pair.bound.now = 32 * 1024  # the deployment raised its limit
    second = pair.sender("second")
    assert second.remote_max_message_size == 32 * 1024
    assert first.remote_max_message_size == 8 * 1024  # told once, at its attach

    pair.send(second, b"x" * (16 * 1024))  # under the new link's bound
    assert len(pair.received()) == 1
    pair.send(first, b"x" * (16 * 1024))  # over the older link's
    (refused,) = pair.too_large()
    assert refused.limit == 8 * 1024
    assert closed_with(first) == "amqp:link:message-size-exceeded"
    assert len(pair.received()) == 1
    assert closed_with(second) is None


def test_a_transfer_past_the_bound_is_refused_within_a_frame_of_it_however_much_one_read_brings() -> None:
    limit = 64 * 1024
    pair = Pair(Bound(limit))
    snd = pair.sender("big")
    reads_before = len(pair.reads)
    pair.send(snd, b"x" * (CAP // 2))
    (refused,) = pair.too_large()
    assert refused.limit == limit
    # One read brought more than the bound and a frame: the refusal still came within a frame of the bound.
    assert max(pair.reads[reads_before:]) > limit + FRAME
    assert limit < refused.size <= limit + FRAME
    assert closed_with(snd) == "amqp:link:message-size-exceeded"
    assert pair.received() == []
    assert held_by_proton(pair.server) == 0  # what came of it was dropped as it came
    # The connection goes on: a new link's message arrives whole.
    pair.send(pair.sender("next"), b"y" * 1000)
    assert len(pair.received()) == 1


def test_without_a_provider_a_link_is_told_the_heads_own_cap() -> None:
    pair = Pair(Bound(0))
    pair.server.link_message_size = None
    assert pair.sender("s").remote_max_message_size == CAP


def test_a_refused_transfer_that_goes_on_a_caps_worth_past_its_limit_closes_the_connection() -> None:
    pair = Pair(Bound(64 * 1024))
    snd = pair.sender("endless")
    pair.send(snd, b"x" * (2 * CAP))  # dropped as it comes, but no client is owed a cap's worth more of it
    (failed,) = [e for e in pair.events if isinstance(e, ev.ProtocolFailed)]
    assert failed.condition == "amqp:link:message-size-exceeded"
    assert failed.too_large
    assert pair.server.closed
    assert pair.conn.state & Endpoint.REMOTE_CLOSED
    assert pair.conn.remote_condition is not None
    assert pair.conn.remote_condition.name == "amqp:link:message-size-exceeded"
    assert pair.received() == []
