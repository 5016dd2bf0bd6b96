"""The upstream's own MQTT client on the wire, byte for byte: a scripted broker on a real socket on 127.0.0.1
reads every packet the hub writes and answers with packets built by hand (paho's test style). CONNECT for 3.1.1 and
5 with and without credentials and session expiry, PUBLISH with MQTT 5 properties and its PUBACK, SUBSCRIBE, our
PUBACK of the broker's QoS 1 PUBLISH, PINGREQ on keepalive, a silent link lost, a broker's oversize or malformed
packet or MQTT 5 DISCONNECT lost with its reason logged, never a traceback; what an MQTT 5 CONNACK announces kept
(Receive Maximum, batches and twin reports alike; Maximum Packet Size)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from edgehub.core import Message
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.mqtt.encoder import encode_varint
from edgehub.upstream.mqtt.settings import MqttProtocol, MqttUpstreamSettings, WireMode
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.twin_channel import TwinChannel
from tests.upstream.scripted_broker import ScriptedBroker, scripted, text, with_header

pytestmark = pytest.mark.timeout(30)

CONNACK_OK_311 = b"\x20\x02\x00\x00"
CONNACK_OK_5 = b"\x20\x03\x00\x00\x00"


def settings(port: int, **kw: object) -> MqttUpstreamSettings:
    base: dict[str, object] = {"host": "127.0.0.1", "port": port, "client_id": "hub1", "hub_id": "hub1"}
    base.update(kw)
    return MqttUpstreamSettings(**base)  # type: ignore[arg-type]


def one(body: bytes, offset: int = 0) -> list[QueuedMessage]:
    return [QueuedMessage(message=Message(body=body), offset=offset, priority=0, enqueued_at_s=1.7e9, ttl_s=60)]


async def accepted(broker: ScriptedBroker, up: MqttUpstream, connack: bytes = CONNACK_OK_311) -> None:
    """The client's connection taken, its CONNECT read and answered, and the client up."""
    await broker.next_connection()
    await broker.read_packet()
    broker.write(connack)
    await up.wait_connected()


PROTOCOL_311 = text("MQTT") + b"\x04"
PROTOCOL_5 = text("MQTT") + b"\x05"
SAS_USER = "127.0.0.1/hub1/?api-version=2021-04-12"


@pytest.mark.parametrize(
    ("kw", "body"),
    [
        # 3.1.1, the session kept (clean session 0), keepalive 30, no credentials
        ({}, PROTOCOL_311 + b"\x00\x00\x1e" + text("hub1")),
        # 3.1.1, clean session, username and password
        (
            {"session_expiry_s": 0, "username": "edge", "password": "s3cret", "keepalive_s": 60},
            PROTOCOL_311 + b"\xc2\x00\x3c" + text("hub1") + text("edge") + text("s3cret"),
        ),
        # 5, the session kept a day (Session Expiry Interval 86400) and our Maximum Packet Size (1 MiB)
        (
            {"protocol": MqttProtocol.V5},
            PROTOCOL_5 + b"\x00\x00\x1e" + b"\x0a\x11\x00\x01\x51\x80\x27\x00\x10\x00\x00" + text("hub1"),
        ),
        # 5, clean start with no session expiry, an IoT Hub SAS token (the username IoT Hub's form)
        (
            {"protocol": MqttProtocol.V5, "session_expiry_s": 0, "sas_token": "SharedAccessSignature sr=x"},
            PROTOCOL_5
            + b"\xc2\x00\x1e"
            + b"\x05\x27\x00\x10\x00\x00"
            + text("hub1")
            + text(SAS_USER)
            + text("SharedAccessSignature sr=x"),
        ),
    ],
    ids=["311-session", "311-credentials-clean", "5-session-expiry", "5-sas-clean-start"],
)
async def test_connect_is_written_byte_for_byte(kw: dict[str, object], body: bytes) -> None:
    async with scripted() as broker, MqttUpstream(settings(broker.port, **kw)) as up:
        await broker.next_connection()
        assert await broker.read_packet() == b"\x10" + bytes((len(body),)) + body
        v5 = kw.get("protocol") is MqttProtocol.V5
        broker.write(CONNACK_OK_5 if v5 else CONNACK_OK_311)
        await up.wait_connected()


async def test_a_publish_carries_its_mqtt5_properties_its_wire_bytes_are_counted_and_a_puback_settles_it() -> None:
    async with scripted() as broker:
        s = settings(broker.port, protocol=MqttProtocol.V5, wire_mode=WireMode.MESSAGE, keepalive_s=60)
        async with MqttUpstream(s) as up:
            await accepted(broker, up, CONNACK_OK_5)
            msg = Message(body=b"21.5", properties={"kind": "t"}, system_properties={"messageId": "m-1"})
            sending = asyncio.create_task(
                up.send([QueuedMessage(message=msg, offset=0, priority=0, enqueued_at_s=1.7e9, ttl_s=60)])
            )
            published = await broker.read_packet()
            props = b"\x26" + text("kind") + text("t") + b"\x26" + text("$.mid") + text("m-1")
            body = text("devices/hub1/messages/events/") + b"\x00\x01" + bytes((len(props),)) + props + b"21.5"
            assert published == b"\x32" + bytes((len(body),)) + body
            assert not sending.done()  # not delivered before its PUBACK
            broker.write(b"\x40\x02\x00\x01")
            result = await sending
            assert [q.offset for q in result.succeeded] == [0]
            assert result.details["wire_bytes"] == str(len(published))

            # MQTT 5: a PUBACK with a failure reason code refuses the message for good.
            refused = asyncio.create_task(up.send(one(b"x", 1)))
            published = await broker.read_packet()
            assert published[0] == 0x32
            assert published[-1:] == b"x"
            broker.write(b"\x40\x03" + _packet_id(published) + b"\x87")  # not authorized
            result = await refused
            assert [q.offset for q in result.invalid] == [1]
            assert result.error is not None
            assert "0x87" in result.error

            # ... but a "not now" reason code (quota exceeded) fails it for a later batch.
            later = asyncio.create_task(up.send(one(b"y", 2)))
            published = await broker.read_packet()
            broker.write(b"\x40\x03" + _packet_id(published) + b"\x97")
            result = await later
            assert [q.offset for q in result.failed] == [2]
            assert not result.invalid


async def test_the_twin_subscribes_in_one_packet_and_our_puback_answers_the_brokers_qos1_publish() -> None:
    async with scripted() as broker:
        up = MqttUpstream(settings(broker.port, keepalive_s=60))
        up.attach_twin(TwinChannel())
        async with up:
            await broker.next_connection()
            await broker.read_packet()
            broker.write(CONNACK_OK_311)
            desired, answers = "$iothub/twin/PATCH/properties/desired/#", "$iothub/twin/res/#"
            body = b"\x00\x01" + text(desired) + b"\x01" + text(answers) + b"\x00"
            assert await broker.read_packet() == b"\x82" + bytes((len(body),)) + body
            get = text("$iothub/twin/GET/?$rid=1")  # QoS 0: no packet id, an empty payload
            assert await broker.read_packet() == b"\x30" + bytes((len(get),)) + get
            broker.write(b"\x90\x04\x00\x01\x01\x00")  # SUBACK: granted QoS 1 and 0
            patch = text("$iothub/twin/PATCH/properties/desired/?$version=2") + b"\x00\x07" + b"{}"
            broker.write(b"\x32" + bytes((len(patch),)) + patch)
            assert await broker.read_packet() == b"\x40\x02\x00\x07"


async def test_a_brokers_publish_over_our_limit_is_acknowledged_and_dropped_and_the_connection_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # MQTT 3.1.1 cannot tell the broker a limit; a broker that keeps the session would send it again on every
    # connection if the client dropped the connection instead (and later cloud messages would never come).
    caplog.set_level(logging.INFO, logger="edgehub.upstream")
    async with scripted() as broker:
        up = MqttUpstream(settings(broker.port, keepalive_s=60, max_packet_bytes=2048))
        up.attach_twin(TwinChannel())
        async with up:
            await broker.next_connection()
            await broker.read_packet()
            broker.write(CONNACK_OK_311)
            await broker.read_packet()  # SUBSCRIBE
            await broker.read_packet()  # the twin GET
            broker.write(b"\x90\x04\x00\x01\x01\x00")
            topic = text("$iothub/twin/PATCH/properties/desired/?$version=2")
            body = topic + b"\x00\x06" + b"{" + b" " * 5000 + b"}"
            huge = b"\x32" + encode_varint(len(body)) + body
            broker.write(huge[:1000])  # in pieces, as a thin link brings it
            broker.write(huge[1000:])
            assert await broker.read_packet() == b"\x40\x02\x00\x06"  # acknowledged: the broker lets it go
            patch = topic + b"\x00\x07" + b"{}"
            broker.write(b"\x32" + bytes((len(patch),)) + patch)
            assert await broker.read_packet() == b"\x40\x02\x00\x07"  # the next one comes on the same connection
            assert up.connected
    lines = [r.getMessage() for r in caplog.records if "reason=packet_too_large" in r.getMessage()]
    assert len(lines) == 1
    assert f"bytes={len(huge)}" in lines[0]
    assert "outcome=acknowledged_and_dropped" in lines[0]
    assert not any("upstream.lost" in r.getMessage() for r in caplog.records)


async def test_an_idle_connection_pings_on_keepalive_and_a_silent_broker_is_noticed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="edgehub.upstream")
    loop = asyncio.get_running_loop()
    async with scripted() as broker:
        started_at = loop.time()  # the CONNECT, the last packet the client sends before the PINGREQ, comes after
        async with MqttUpstream(settings(broker.port, keepalive_s=1)) as up:
            await accepted(broker, up)
            assert await broker.read_packet() == b"\xc0\x00"  # PINGREQ after a keepalive with nothing sent
            assert loop.time() - started_at >= 0.99
            broker.write(b"\xd0\x00")  # PINGRESP
            assert await broker.read_packet() == b"\xc0\x00"  # and again a keepalive later: still up
            answered_at = loop.time()
            # Now the broker goes silent (as a link that drops every packet would): lost within 1.5 keepalives
            # of the last packet heard.
            await up.wait_for(lambda: not up.connected)
            assert loop.time() - answered_at < 1.5
            assert await broker.closed_by_client()
    assert any("upstream.lost" in r.getMessage() and "keepalive" in r.getMessage() for r in caplog.records)


async def test_a_publish_unanswered_loses_the_connection_one_keepalive_after_the_last_thing_heard(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under traffic a silence is noticed one keepalive after the broker was last heard, not 1.5; a question asked
    after a quiet spell still gets half a keepalive for its answer."""
    caplog.set_level(logging.INFO, logger="edgehub.upstream")
    loop = asyncio.get_running_loop()
    async with scripted() as broker, MqttUpstream(settings(broker.port, keepalive_s=2)) as up:
        await accepted(broker, up)
        heard_at = loop.time()  # the CONNACK: the last thing the client hears
        await asyncio.sleep(0.4)
        done = await up.submit(one(b"21.5"))
        await broker.read_packet()  # the PUBLISH; the broker never answers it
        asked_at = loop.time()
        await up.wait_for(lambda: not up.connected)
        lost_at = loop.time()
        assert 1.95 <= lost_at - heard_at < 2.5, lost_at - heard_at  # 1.5 keepalives would be 3 s
        assert lost_at - asked_at >= 1.0  # half a keepalive at least for the answer
        assert (await done).failed
    assert any("upstream.lost" in r.getMessage() and "keepalive" in r.getMessage() for r in caplog.records)


async def test_a_question_after_a_quiet_spell_gets_half_a_keepalive_for_its_answer() -> None:
    async with scripted() as broker, MqttUpstream(settings(broker.port, keepalive_s=2)) as up:
        await accepted(broker, up)
        await asyncio.sleep(1.7)  # quiet: nothing awaited, nothing heard since the CONNACK
        done = await up.submit(one(b"21.5"))
        published = await broker.read_packet()
        await asyncio.sleep(0.6)  # 2.3 s since the CONNACK: a keepalive without hearing, but asked only 0.6 s ago
        assert up.connected
        broker.write(b"\x40\x02" + _packet_id(published))
        assert (await done).succeeded
        assert up.connected


async def test_answers_that_keep_coming_within_a_keepalive_keep_a_slow_link_up() -> None:
    """PUBLISHes awaiting their PUBACKs for longer than a keepalive in all, each answered within one of the last."""
    async with scripted() as broker, MqttUpstream(settings(broker.port, keepalive_s=1)) as up:
        await accepted(broker, up)
        results = [await up.submit(one(b"%d" % i, i)) for i in range(4)]
        published = [await broker.read_packet() for _ in range(4)]
        for packet in published:  # 4 x 0.7 s = 2.8 s with PUBLISHes awaited all along
            await asyncio.sleep(0.7)
            broker.write(b"\x40\x02" + _packet_id(packet))
        for r in results:
            assert (await r).succeeded
        assert up.connected


@pytest.mark.parametrize(
    ("bad", "reason", "detail"),
    [
        (b"\x90\x88\x27", "packet_too_large", "over the limit of 2048"),  # a SUBACK announcing 5000 bytes
        (b"\x30\xff\xff\xff\xff\x01", "malformed_packet", "remaining length over four bytes"),
        (b"\x00\x00", "malformed_packet", "packet type 0"),
        (b"\x30\x04\x00\x02\xff\xfe", "malformed_packet", "not UTF-8"),
        (b"\x34\x03\x00\x01a", "malformed_packet", "QoS 2"),
    ],
    ids=["oversize", "bad-length", "bad-type", "bad-utf8", "qos2"],
)
async def test_a_broker_packet_over_the_limit_or_malformed_loses_the_connection_with_its_reason_logged(
    bad: bytes, reason: str, detail: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edgehub.upstream")
    async with scripted() as broker:
        s = settings(broker.port, max_packet_bytes=2048, keepalive_s=60, reconnect_min_s=30.0)
        async with MqttUpstream(s) as up:
            await accepted(broker, up)
            sending = asyncio.create_task(up.send(one(b"x")))
            await broker.read_packet()  # the PUBLISH, in flight when the broker breaks the protocol
            broker.write(bad)
            result = await sending
            assert [q.offset for q in result.failed] == [0]  # failed, to be sent again: never reported delivered
            assert not up.connected
            assert await broker.closed_by_client()
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"reason={reason}" in line and detail in line for line in lines), lines
    assert not any(r.exc_info for r in caplog.records)


async def test_an_mqtt5_server_disconnect_loses_the_connection_with_the_brokers_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="edgehub.upstream")
    async with scripted() as broker:
        s = settings(broker.port, protocol=MqttProtocol.V5, keepalive_s=60, reconnect_min_s=30.0)
        async with MqttUpstream(s) as up:
            await accepted(broker, up, CONNACK_OK_5)
            reason = b"\x1f" + text("maintenance")
            broker.write(with_header(0xE0, b"\x8b" + bytes((len(reason),)) + reason))  # server shutting down
            await up.wait_for(lambda: not up.connected)
            assert await broker.closed_by_client()
    lost = [r.getMessage() for r in caplog.records if "upstream.lost" in r.getMessage()]
    assert lost, caplog.text
    assert "reason 0x8b (maintenance)" in lost[0], lost


class _Heard(logging.Handler):
    """Sets ``event`` when a log line holding ``word`` is emitted (on the loop's thread, as the transport logs)."""

    def __init__(self, word: str) -> None:
        super().__init__(logging.INFO)
        self.word = word
        self.event = asyncio.Event()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.word in record.getMessage():
            self.lines.append(record.getMessage())
            self.event.set()


async def test_a_refused_mqtt5_connack_is_a_refusal_with_its_reason_and_the_socket_is_closed() -> None:
    heard = _Heard("upstream.connect_refused")
    logger = logging.getLogger("edgehub.upstream.mqtt.transport")
    logger.addHandler(heard)
    try:
        async with scripted() as broker:
            s = settings(broker.port, protocol=MqttProtocol.V5, reconnect_refused_min_s=30.0)
            async with MqttUpstream(s) as up:
                await broker.next_connection()
                await broker.read_packet()
                reason = b"\x1f" + text("bad token")
                broker.write(with_header(0x20, b"\x00\x87" + bytes((len(reason),)) + reason))  # not authorized
                assert await broker.closed_by_client()
                await heard.event.wait()
                assert not up.connected
                assert broker.accepted.empty()  # a refusal backs off hard: no second attempt at once
    finally:
        logger.removeHandler(heard)
    assert "CONNACK refused: 0x87 bad token" in heard.lines[0]


def connack_5(props: bytes) -> bytes:
    return with_header(0x20, b"\x00\x00" + bytes((len(props),)) + props)


@asynccontextmanager
async def connected(broker: ScriptedBroker, s: MqttUpstreamSettings, connack: bytes) -> AsyncIterator[MqttUpstream]:
    """The upstream on ``s``, connected to ``broker``, which answered its CONNECT with ``connack``."""
    async with MqttUpstream(s) as up:
        await broker.next_connection()
        await broker.read_packet()
        broker.write(connack)
        await up.wait_connected()
        yield up


async def test_no_more_publishes_await_their_puback_than_the_brokers_receive_maximum_leaves_for_batches() -> None:
    async with scripted() as broker:
        s = settings(broker.port, protocol=MqttProtocol.V5, wire_mode=WireMode.MESSAGE, keepalive_s=60)
        # Receive Maximum 3: 2 for batches, 1 for answers and reports
        async with connected(broker, s, connack_5(b"\x21\x00\x03")) as up:
            batch = [q for i in range(4) for q in one(b"m%d" % i, i)]
            sending = asyncio.create_task(up.send(batch))
            first, second = await broker.read_packet(), await broker.read_packet()
            assert not up.has_room
            with pytest.raises(TimeoutError):  # the third waits for a PUBACK
                await asyncio.wait_for(broker.read_packet(), 0.3)
            for published in (first, second):
                broker.write(b"\x40\x02" + _packet_id(published))
            third, fourth = await broker.read_packet(), await broker.read_packet()
            for published in (third, fourth):
                broker.write(b"\x40\x02" + _packet_id(published))
            result = await sending
            assert [q.offset for q in result.succeeded] == [0, 1, 2, 3]
            assert [p[-2:] for p in (first, second, third, fourth)] == [b"m0", b"m1", b"m2", b"m3"]


@asynccontextmanager
async def with_twin(
    broker: ScriptedBroker, s: MqttUpstreamSettings, connack: bytes
) -> AsyncIterator[tuple[MqttUpstream, TwinChannel]]:
    """``connected``, with a twin channel attached, past its SUBSCRIBE and its GET (both left unanswered)."""
    twin = TwinChannel()
    up = MqttUpstream(s)
    up.attach_twin(twin)
    async with up:
        await broker.next_connection()
        await broker.read_packet()
        broker.write(connack)
        await up.wait_connected()
        assert (await broker.read_packet())[0] == 0x82  # SUBSCRIBE
        assert (await broker.read_packet())[0] == 0x30  # the GET, QoS 0
        yield up, twin


async def nothing_written(broker: ScriptedBroker) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(broker.read_packet(), 0.3)


async def test_a_report_waits_for_the_receive_maximum_and_goes_before_the_next_batch_publish() -> None:
    async with scripted() as broker:
        s = settings(broker.port, protocol=MqttProtocol.V5, wire_mode=WireMode.MESSAGE, keepalive_s=60)
        async with with_twin(broker, s, connack_5(b"\x21\x00\x01")) as (up, twin):  # Receive Maximum 1
            sending = asyncio.create_task(up.send([*one(b"m0", 0), *one(b"m1", 1)]))
            first = await broker.read_packet()
            twin.report({"state": "running"})
            await nothing_written(broker)  # the report waits: m0 holds the one slot
            broker.write(b"\x40\x02" + _packet_id(first))
            report = await broker.read_packet()
            assert _topic(report).startswith("$iothub/twin/PATCH/properties/reported/")
            assert report.endswith(b'{"state":"running"}')
            await nothing_written(broker)  # m1 waits for the report's PUBACK
            broker.write(b"\x40\x02" + _packet_id(report))
            second = await broker.read_packet()
            broker.write(b"\x40\x02" + _packet_id(second))
            result = await sending
            assert [p[-2:] for p in (first, second)] == [b"m0", b"m1"]
            assert [q.offset for q in result.succeeded] == [0, 1]


async def test_reports_held_past_their_bound_drop_the_oldest_with_a_refusal_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="edgehub.upstream")
    async with scripted() as broker:
        s = settings(broker.port, protocol=MqttProtocol.V5, keepalive_s=60)
        async with with_twin(broker, s, connack_5(b"\x21\x00\x01")) as (up, twin):
            twin.report({"n": 0})  # takes the one slot
            for n in range(1, 18):  # 17 more: one over the 16 that may wait
                twin.report({"n": n})
            seen = []
            for _ in range(17):
                report = await broker.read_packet()
                seen.append(report[report.index(b"{") :])
                broker.write(b"\x40\x02" + _packet_id(report))
            await nothing_written(broker)
            assert seen == [b'{"n":%d}' % n for n in (0, *range(2, 18))]
            assert up.connected
    lines = [r.getMessage() for r in caplog.records if "reason=quota_exceeded" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "Receive Maximum of 1" in lines[0]


async def test_a_report_over_the_brokers_maximum_packet_size_is_dropped_with_a_refusal_and_the_next_one_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="edgehub.upstream")
    async with scripted() as broker:
        s = settings(broker.port, keepalive_s=60, broker_max_packet_bytes=1024)
        async with with_twin(broker, s, CONNACK_OK_311) as (up, twin):
            twin.report({"big": "x" * 2000})
            await nothing_written(broker)
            twin.report({"small": 1})
            report = await broker.read_packet()
            assert report.endswith(b'{"small":1}')
            assert up.connected
    lines = [r.getMessage() for r in caplog.records if "reason=too_large" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "Maximum Packet Size of 1024" in lines[0]


@pytest.mark.parametrize(
    ("protocol", "connack", "setting"),
    [
        (MqttProtocol.V5, connack_5(b"\x27\x00\x00\x04\x00"), None),  # the broker announces 1024
        (MqttProtocol.V311, CONNACK_OK_311, 1024),  # a 3.1.1 broker announces nothing: the setting says 1024
        (MqttProtocol.V5, connack_5(b"\x27\x00\x00\x10\x00"), 1024),  # announced 4096, set 1024: the smaller
    ],
    ids=["5-announced", "311-set", "5-set-smaller"],
)
async def test_segments_are_cut_to_the_brokers_maximum_packet_size_and_a_message_over_it_is_refused_alone(
    protocol: MqttProtocol, connack: bytes, setting: int | None
) -> None:
    async with scripted() as broker:
        s = settings(
            broker.port, protocol=protocol, keepalive_s=60, max_batch_bytes=60_000, broker_max_packet_bytes=setting
        )
        async with connected(broker, s, connack) as up:
            noise = random.Random(7).randbytes(3000)  # no compression shrinks it below the broker's limit
            batch = [q for i in range(80) for q in one(b'{"seq": %d, "t": 21.5, "unit": "C"}' % i, i)]
            batch += one(noise, 80)
            sending = asyncio.create_task(up.send(batch))
            sizes: list[int] = []
            while True:
                try:
                    published = await asyncio.wait_for(broker.read_packet(), 1.0)
                except TimeoutError:
                    break
                sizes.append(len(published))
                broker.write(b"\x40\x02" + _packet_id(published))
            result = await sending
            assert len(sizes) > 1
            assert max(sizes) <= 1024
            assert sorted(q.offset for q in result.succeeded) == list(range(80))
            assert [q.offset for q in result.invalid] == [80]
            assert result.error is not None
            assert "Maximum Packet Size of 1024" in result.error
            assert up.connected  # the connection was kept: nothing over the limit was written


def _topic_at(publish: bytes) -> tuple[int, int]:
    """Where a PUBLISH's topic starts (after the fixed header and the topic's length) and how many bytes it has."""
    pos = 1
    while publish[pos] & 0x80:
        pos += 1
    pos += 1
    return pos + 2, int.from_bytes(publish[pos : pos + 2], "big")


def _topic(publish: bytes) -> str:
    start, length = _topic_at(publish)
    return publish[start : start + length].decode()


def _packet_id(publish: bytes) -> bytes:
    """The packet id of a QoS 1 PUBLISH: after the topic."""
    start, length = _topic_at(publish)
    return publish[start + length : start + length + 2]
