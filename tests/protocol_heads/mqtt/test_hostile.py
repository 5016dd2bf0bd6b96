"""The MQTT head against a hostile outside: closed connections freed without the cycle collector,
bounded subscriptions and topic caches, pre-login caps, login throttling, clients that never read, and every
refusal logged through the server's RefusalLog."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import ssl
import tracemalloc
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from edgehub.core import Message
from edgehub.core.message_size import MAX_MESSAGE_SIZE_BYTES, WIRE_ENVELOPE_BYTES
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import (
    MQTT_50,
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    PropertyId,
    PubAck,
    Publish,
    ReasonCode,
    SubAck,
    Subscribe,
    Subscription,
)
from edgehub.testing import InMemoryHub
from edgehub.testing.certs import TestCA
from protocol_heads.mqtt.client_socket import ClientSocket
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, Paho, sas_password, server_context, username
from tests.protocol_heads.mqtt.rawclient import RawClient

LOG = "protocol_heads.mqtt.server"


def dev_connect(level: int = MQTT_50, *, password: str | None = None, user: str | None = None, **kw: Any) -> Connect:
    return Connect(
        "dev1",
        protocol_level=level,
        username=username(DEV) if user is None else user,
        password=(password or sas_password(DEV, DEVICE_KEY)).encode(),
        **kw,
    )


async def polled(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Until ``condition()`` holds: nothing signals that an object was freed or a socket closed server-side."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 (no event to wait for; polled, bounded)
            await asyncio.sleep(0.01)


@pytest.fixture
async def server(hub: InMemoryHub, ca: TestCA) -> AsyncIterator[MqttServer]:
    settings = MqttSettings(tcp_port=0, tls_port=0, ssl_context=server_context(ca), connect_timeout_s=5.0)
    async with MqttServer(hub, settings=settings) as s:
        yield s


def client_tls(ca: TestCA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.ca_pem))
    ctx.check_hostname = False
    return ctx


# --- 1. closed connections are freed by reference counting ---------------------------------------------------


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """The cycle collector off for the test, as good as ``edgehub run``'s rare collections: what is not freed by
    reference counting stays."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def live_clients() -> list[ClientSocket]:
    return [o for o in gc.get_objects() if type(o) is ClientSocket]


class Watch:
    """Weak references to the socket side, the session side and the ``ServerConnection`` of every connection made
    while watching."""

    def __init__(self) -> None:
        self._before = {id(c) for c in live_clients()}
        self.refs: list[weakref.ref[Any]] = []

    def take(self) -> int:
        for c in live_clients():
            if id(c) not in self._before:
                self._before.add(id(c))
                self.refs.append(weakref.ref(c))
                self.refs.append(weakref.ref(c.session))
                self.refs.append(weakref.ref(c.conn))
        return len(self.refs) // 3

    async def seen(self, count: int) -> None:
        """Until ``count`` connections of this watch have their ``ClientSocket`` (taken as soon as the server has
        it)."""
        await polled(lambda: self.take() >= count)

    def alive(self) -> int:
        return sum(ref() is not None for ref in self.refs)


async def timed_out_mid_connect(port: int, ca: TestCA, watch: Watch) -> None:
    c = await RawClient.open(port)
    await watch.seen(1)
    c.send_raw(b"\x10\xff\xff\x03" + b"\x00" * 40_000)  # most of a ~60 KB CONNECT, never finished
    assert await c.closed_by_server()
    await c.close()


async def timed_out_after_tls(port: int, ca: TestCA, watch: Watch) -> None:
    c = await RawClient.open(port, tls=client_tls(ca))
    await watch.seen(1)
    assert await c.closed_by_server()
    await c.close()


async def refused(port: int, ca: TestCA, watch: Watch) -> None:
    c = await RawClient.open(port, level=MQTT_50)
    await watch.seen(1)
    ack = await c.login(dev_connect(password="SharedAccessSignature sr=x&sig=bad&se=4000000000"))
    assert isinstance(ack, ConnAck)
    assert ack.reason_code == ReasonCode.NOT_AUTHORIZED
    assert await c.closed_by_server()
    await c.close()


async def normal_disconnect(port: int, ca: TestCA, watch: Watch) -> None:
    c = await RawClient.open(port, level=MQTT_50, tls=client_tls(ca))
    await watch.seen(1)
    assert await c.login(dev_connect()) == ConnAck(0, False, CONNACK_PROPERTIES)
    c.send(Publish("devices/dev1/messages/events/", b"x", 1, packet_id=1))
    assert await c.next() == PubAck(1)
    c.send(Disconnect())
    assert await c.closed_by_server()
    await c.close()


async def taken_over(port: int, ca: TestCA, watch: Watch) -> None:
    first = await RawClient.open(port, level=MQTT_50)
    await watch.seen(1)
    assert isinstance(await first.login(dev_connect()), ConnAck)
    second = await RawClient.open(port, level=MQTT_50)
    await watch.seen(2)
    assert isinstance(await second.login(dev_connect()), ConnAck)
    gone = await first.next()
    assert isinstance(gone, Disconnect)
    assert gone.reason_code == ReasonCode.SESSION_TAKEN_OVER
    second.send(Disconnect())
    assert await second.closed_by_server()
    await first.close()
    await second.close()


async def crashed(port: int, ca: TestCA, watch: Watch) -> None:
    c = await RawClient.open(port, level=MQTT_50)
    await watch.seen(1)
    assert isinstance(await c.login(dev_connect()), ConnAck)
    c.send(Publish("devices/dev1/messages/events/", b"x", 1, packet_id=1))
    assert await c.next() == PubAck(1)
    c.reset()


CONNACK_PROPERTIES = Properties(
    {
        PropertyId.RECEIVE_MAXIMUM: 1024,
        PropertyId.RETAIN_AVAILABLE: 0,
        PropertyId.MAXIMUM_PACKET_SIZE: MAX_MESSAGE_SIZE_BYTES + WIRE_ENVELOPE_BYTES,  # the hub's cap and framing
        PropertyId.TOPIC_ALIAS_MAXIMUM: 16,
        PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
        PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 0,
        PropertyId.SHARED_SUBSCRIPTION_AVAILABLE: 0,
    }
)


@pytest.mark.parametrize(
    ("session", "listener"),
    [
        (timed_out_mid_connect, "tcp"),
        (timed_out_after_tls, "tls"),
        (refused, "tcp"),
        (normal_disconnect, "tls"),
        (taken_over, "tcp"),
        (crashed, "tcp"),
    ],
)
async def test_a_closed_connection_is_freed_without_the_cycle_collector(
    hub: InMemoryHub, ca: TestCA, no_cycle_collector: None, session: Callable[..., Any], listener: str
) -> None:
    settings = MqttSettings(tcp_port=0, tls_port=0, ssl_context=server_context(ca), connect_timeout_s=0.5)
    async with MqttServer(hub, settings=settings) as server:
        watch = Watch()
        await session(server.ports[listener], ca, watch)
        await polled(lambda: server.limiter.total == 0 and not server._tasks)
        # Freed by reference counting alone: no gc.collect() anywhere.
        await polled(lambda: watch.alive() == 0, timeout_s=2.0)
        assert gc.isenabled() is False


async def test_a_connection_refused_at_accept_is_freed_too(hub: InMemoryHub, no_cycle_collector: None) -> None:
    settings = MqttSettings(tcp_port=0, tls_port=None, max_pending_per_address=1)
    async with MqttServer(hub, settings=settings) as server:
        watch = Watch()
        held = await RawClient.open(server.ports["tcp"])
        await polled(lambda: server.limiter.pending == 1)
        over = await RawClient.open(server.ports["tcp"])
        assert await over.closed_by_server()
        watch.take()
        await held.close()
        await over.close()
        await polled(lambda: server.limiter.total == 0 and not server._tasks)
        await polled(lambda: watch.alive() == 0, timeout_s=2.0)


# --- 2. memory amplification by a logged-in client ----------------------------------------------------------


async def test_subscriptions_beyond_the_limit_get_quota_exceeded_and_long_filters_are_invalid(
    hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    settings = MqttSettings(tcp_port=0, tls_port=None, max_subscriptions=3, max_filter_length=64)
    caplog.set_level(logging.INFO, LOG)
    async with MqttServer(hub, settings=settings) as server:
        c = await RawClient.open(server.ports["tcp"], level=MQTT_50)
        assert isinstance(await c.login(dev_connect()), ConnAck)
        base = "devices/dev1/messages/devicebound/"
        filters = [base + f"f{i}" for i in range(5)] + [base + "x" * 60]
        c.send(Subscribe(1, tuple(Subscription(f, 1) for f in filters)))
        ack = await c.next()
        assert ack == SubAck(1, (1, 1, 1, 0x97, 0x97, 0x8F))
        # Subscribing again to a filter it has costs nothing and is granted.
        c.send(Subscribe(2, (Subscription(base + "f0", 1),)))
        assert await c.next() == SubAck(2, (1,))
        await c.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert any("reason=too_many_subscriptions" in line and "client=dev1" in line for line in lines)
    assert any("reason=filter_too_long" in line for line in lines)


async def test_a_v311_client_gets_0x80_for_a_subscription_over_the_limit(hub: InMemoryHub) -> None:
    settings = MqttSettings(tcp_port=0, tls_port=None, max_subscriptions=1)
    async with MqttServer(hub, settings=settings) as server:
        c = await RawClient.open(server.ports["tcp"])
        assert await c.login(dev_connect(4)) == ConnAck(0, False)
        base = "devices/dev1/messages/devicebound/"
        c.send(Subscribe(1, (Subscription(base + "a", 1), Subscription(base + "b", 1))))
        assert await c.next() == SubAck(1, (1, 0x80))
        await c.close()


async def test_refused_publishes_to_unique_long_topics_leave_no_memory_behind(hub: InMemoryHub) -> None:
    """Before: a process-wide parse cache kept 4,096 topics whatever their length, and the decoder 1,024."""
    settings = MqttSettings(tcp_port=0, tls_port=None)
    async with MqttServer(hub, settings=settings) as server:
        c = await RawClient.open(server.ports["tcp"])
        assert await c.login(dev_connect(4)) == ConnAck(0, False)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(1500):  # 6 MB of topics, each refused (another device's) and each used once
                c.send(Publish(f"devices/other/messages/events/{i:06d}" + "k" * 4000, b"", 0))
                if i % 100 == 99:
                    await c.writer.drain()
            # A QoS 1 message after them: its ack means every refused one was handled.
            c.send(Publish("devices/dev1/messages/events/", b"x", 1, packet_id=1))
            assert await c.next() == PubAck(1)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert grown < 1_000_000, f"{grown} bytes kept after 1,500 refused 4 KB topics (bound: 1 MB)"
        await c.close()


async def test_a_topic_over_the_length_limit_is_refused_and_a_method_response_is_never_routed(
    hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    settings = MqttSettings(tcp_port=0, tls_port=None, max_topic_length=100)
    caplog.set_level(logging.INFO, LOG)
    async with MqttServer(hub, settings=settings) as server:
        c = await RawClient.open(server.ports["tcp"], level=MQTT_50)
        assert isinstance(await c.login(dev_connect()), ConnAck)
        c.send(Publish("devices/dev1/messages/events/" + "a=b&" * 30, b"x", 1, packet_id=1))
        ack = await c.next()
        assert isinstance(ack, PubAck)
        assert ack.reason_code == ReasonCode.TOPIC_NAME_INVALID
        c.send(Publish("$iothub/methods/res/200/?$rid=1", b"{}", 1, packet_id=2))
        ack = await c.next()
        assert isinstance(ack, PubAck)
        assert ack.reason_code == ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        assert ack.properties.get_str(PropertyId.REASON_STRING) == "no direct method call is pending"
        c.send(Publish("devices/dev1/messages/events/", b"ok", 1, packet_id=3))
        assert await c.next() == PubAck(3)
        await c.close()
    assert [m.body for _, m in hub.stored] == [b"ok"]
    text = caplog.text
    assert "reason=topic_too_long" in text
    assert "reason=no_pending_call" in text


# --- 5. username, throttled logins --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "accepted"),
    [
        (f"{HOST}/dev1", True),
        (f"{HOST}/dev1/?api-version=2021-04-12", True),
        ("dev1", True),  # the client id itself (plain password logins)
        (f"{HOST}/dev2", False),
        (f"{HOST}/dev1/filter", False),
        ("someone-else", False),
    ],
)
async def test_a_username_without_api_version_is_checked_against_the_client_id(
    hub: InMemoryHub, user: str, accepted: bool
) -> None:
    async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
        c = await RawClient.open(server.ports["tcp"], level=MQTT_50)
        ack = await c.login(dev_connect(user=user))
        assert isinstance(ack, ConnAck)
        assert (ack.reason_code == 0) is accepted
        if not accepted:
            assert ack.reason_code in (ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, ReasonCode.BAD_USERNAME_OR_PASSWORD)
            assert ack.properties.get_str(PropertyId.REASON_STRING)
        await c.close()


async def test_five_bad_logins_naming_a_device_do_not_lock_out_its_valid_login_from_another_address(
    hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    settings = MqttSettings(tcp_port=0, tls_port=None)  # the defaults: 5 per (address, identity), 30 per address
    caplog.set_level(logging.INFO, LOG)
    bad = "SharedAccessSignature sr=x&sig=bad&se=4000000000"
    async with MqttServer(hub, settings=settings) as server:
        port = server.ports["tcp"]
        for _ in range(settings.max_login_failures):
            c = await RawClient.open(port, level=MQTT_50, source="127.0.0.2")
            assert (await c.login(dev_connect(password=bad))) == ConnAck(
                ReasonCode.NOT_AUTHORIZED, False, Properties({PropertyId.REASON_STRING: "authentication failed"})
            )
            await c.close()
        # dev1's own key from an address that has not failed gets in at once...
        c = await RawClient.open(port, level=MQTT_50, source="127.0.0.3")
        assert await c.login(dev_connect()) == ConnAck(0, False, CONNACK_PROPERTIES)
        await c.close()
        # ... while the address that failed is refused for dev1 at once, even with the right key ...
        c = await RawClient.open(port, level=MQTT_50, source="127.0.0.2")
        ack = await c.login(dev_connect())
        assert isinstance(ack, ConnAck)
        assert ack.reason_code == ReasonCode.CONNECTION_RATE_EXCEEDED
        await c.close()
        # ... and a 3.1.1 client there hears 0x05.
        c = await RawClient.open(port, source="127.0.0.2")
        assert await c.login(dev_connect(4)) == ConnAck(0x05, False)
        await c.close()
        assert server.logins.refused == 2  # throttled, the key not even checked
    # (five refusal lines for the address already: the throttled ones are held back and counted)
    assert caplog.text.count("reason=bad_credentials peer=127.0.0.2 client=dev1") == settings.max_login_failures


async def test_an_address_that_keeps_failing_for_any_identity_is_throttled_for_all(hub: InMemoryHub) -> None:
    settings = MqttSettings(tcp_port=0, tls_port=None, max_login_failures=3, max_login_failures_per_address=3)
    async with MqttServer(hub, settings=settings) as server:
        port = server.ports["tcp"]
        for n in range(3):
            c = await RawClient.open(port, level=MQTT_50, source="127.0.0.6")
            ack = await c.login(Connect(f"guess{n}", protocol_level=MQTT_50, username=f"guess{n}", password=b"x"))
            assert isinstance(ack, ConnAck)
            assert ack.reason_code == ReasonCode.NOT_AUTHORIZED
            await c.close()
        c = await RawClient.open(port, level=MQTT_50, source="127.0.0.6")
        ack = await c.login(dev_connect())
        assert isinstance(ack, ConnAck)
        assert ack.reason_code == ReasonCode.CONNECTION_RATE_EXCEEDED
        await c.close()
        c = await RawClient.open(port, level=MQTT_50, source="127.0.0.7")
        assert await c.login(dev_connect()) == ConnAck(0, False, CONNACK_PROPERTIES)
        await c.close()


async def test_one_device_with_a_stale_key_does_not_lock_its_neighbours_out(hub: InMemoryHub) -> None:
    """Behind one NAT: a source address may fail more often than one client id before it is throttled."""
    settings = MqttSettings(tcp_port=0, tls_port=None, max_login_failures=3, max_login_failures_per_address=10)
    bad = "SharedAccessSignature sr=x&sig=bad&se=4000000000"
    async with MqttServer(hub, settings=settings) as server:
        for _ in range(5):
            c = await RawClient.open(server.ports["tcp"], level=MQTT_50, source="127.0.0.11")
            await c.login(Connect("dev1/filter", protocol_level=MQTT_50, password=bad.encode()))
            await c.close()
        c = await RawClient.open(server.ports["tcp"], level=MQTT_50, source="127.0.0.11")
        assert await c.login(dev_connect()) == ConnAck(0, False, CONNACK_PROPERTIES)
        await c.close()


# --- 6. refusals are visible, and rate-limited --------------------------------------------------------------


async def test_refusals_name_the_peer_and_client_and_are_rate_limited_per_address(
    hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    settings = MqttSettings(tcp_port=0, tls_port=None)
    caplog.set_level(logging.INFO, LOG)
    async with MqttServer(hub, settings=settings) as server:
        port = server.ports["tcp"]
        c = await RawClient.open(port, level=MQTT_50, source="127.0.0.7")
        await c.login(dev_connect(password="SharedAccessSignature sr=x&sig=bad&se=4000000000"))
        await c.close()
        for _ in range(8):  # garbage before any CONNECT: refusals that can only name the peer
            c = await RawClient.open(port, source="127.0.0.8")
            c.send_raw(b"\x30\x02\x00\x00")
            assert await c.closed_by_server()
            await c.close()
        await polled(lambda: server.refusals.total >= 9)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused ")]
    assert any(line.startswith("refused reason=bad_credentials peer=127.0.0.7 client=dev1 ") for line in lines), lines
    garbage = [line for line in lines if "peer=127.0.0.8" in line]
    assert len(garbage) == 5  # RefusalLog's burst per address per window
    assert all(line.startswith("refused reason=malformed_packet peer=127.0.0.8 client=- ") for line in garbage)
    assert server.refusals.suppressed == 3


# --- 3. pre-login caps --------------------------------------------------------------------------------------


async def test_pre_login_connections_over_the_per_address_cap_are_closed_while_others_log_in(
    hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    settings = MqttSettings(tcp_port=0, tls_port=None, max_pending_per_address=4, max_pending_connections=8)
    caplog.set_level(logging.INFO, LOG)
    async with MqttServer(hub, settings=settings) as server:
        port = server.ports["tcp"]
        idle = [await RawClient.open(port, source="127.0.0.9") for _ in range(4)]
        await polled(lambda: server.limiter.pending == 4)
        over = await RawClient.open(port, source="127.0.0.9")
        assert await over.closed_by_server(timeout_s=2.0)
        await over.close()
        # Another address still gets in and logs in.
        dev = await RawClient.open(port, level=MQTT_50, source="127.0.0.10")
        assert isinstance(await dev.login(dev_connect()), ConnAck)
        assert server.connected == ["dev1"]
        # Once logged in a connection no longer counts against the pre-login caps.
        assert server.limiter.pending == 4
        assert server.limiter.total == 5
        more = [await RawClient.open(port, source=f"127.0.1.{i}") for i in range(4)]
        await polled(lambda: server.limiter.pending == 8)
        full = await RawClient.open(port, source="127.0.2.1")
        assert await full.closed_by_server(timeout_s=2.0)
        for c in [*idle, *more, full, dev]:
            await c.close()
    assert "reason=too_many_connections peer=127.0.0.9 client=- " in caplog.text
    assert "cap=pending" in caplog.text


async def test_the_connect_timeout_shortens_while_over_half_the_pre_login_cap_is_used(hub: InMemoryHub) -> None:
    settings = MqttSettings(
        tcp_port=0, tls_port=None, connect_timeout_s=30.0, busy_connect_timeout_s=0.2, max_pending_connections=4
    )
    async with MqttServer(hub, settings=settings) as server:
        port = server.ports["tcp"]
        patient = [await RawClient.open(port, source=f"127.0.3.{i}") for i in range(2)]  # half the cap: 30 s
        await polled(lambda: server.limiter.pending == 2)
        hurried = await RawClient.open(port, source="127.0.3.9")  # the third of four: 0.2 s
        assert await hurried.closed_by_server(timeout_s=5.0)
        await polled(lambda: server.limiter.pending == 2)  # its place goes back once its socket is gone
        for c in [*patient, hurried]:
            await c.close()


# --- 4. a client that never reads ---------------------------------------------------------------------------


async def test_a_client_that_never_reads_is_aborted_after_its_keepalive(
    hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    """Its write buffer fills and reading pauses; before, the pause counted as ours and it stayed forever."""
    caplog.set_level(logging.INFO, LOG)
    async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", server.ports["tcp"]))
        await loop.sock_sendall(sock, encode(dev_connect(4, keepalive_s=1), 4))
        # A device gets device-bound messages once it subscribed to them (as from IoT Hub).
        devicebound = Subscribe(1, (Subscription("devices/dev1/messages/devicebound/#", 1),))
        await loop.sock_sendall(sock, encode(devicebound, 4))
        await hub.wait_connected(DEV)
        # 16 device-bound messages of 512 KB (the window): more than loopback's buffers and the high-water mark.
        for _ in range(16):
            hub.enqueue(DEV, None, Message(b"\x00" * 512 * 1024))
        # It keeps publishing QoS 1 (its acks are never read either) while the server still reads it.
        publish = encode(Publish("devices/dev1/messages/events/", b"x", 1, packet_id=1), 4)
        started = loop.time()
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(20):
                while "dev1" in server.connected:
                    with contextlib.suppress(BlockingIOError):
                        sock.send(publish)
                    await asyncio.sleep(0.05)
        await hub.wait_disconnected(DEV)
        # Closed by the not-reading rule (1.5 s for keepalive 1), whatever keepalive's own timer thought.
        assert loop.time() - started < 15
        sock.close()
    assert "reason=not_reading peer=127.0.0.1 client=dev1 " in caplog.text


# --- 8. packets bounded by the deployment's message size, as it is when a connection is accepted --------------


async def test_a_connection_is_told_the_deployments_bound_at_accept_and_keeps_it(
    hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    largest = [256 * 1024]  # the deployment's largest maxMessageSizeBytes (serve passes the store's), steered here
    settings = MqttSettings(tcp_port=0, tls_port=None, largest_message_size=lambda: largest[0])
    caplog.set_level(logging.INFO, LOG)
    async with MqttServer(hub, settings=settings) as server:
        port = server.ports["tcp"]
        first = await RawClient.open(port, level=MQTT_50)
        ack = await first.login(dev_connect())
        assert isinstance(ack, ConnAck)
        assert ack.properties.values[PropertyId.MAXIMUM_PACKET_SIZE] == 264 * 1024  # 256 KiB and the framing
        await first.close()

        largest[0] = 512 * 1024  # raised: the next connection is told so
        kept = await RawClient.open(port, level=MQTT_50)
        ack = await kept.login(dev_connect())
        assert isinstance(ack, ConnAck)
        assert ack.properties.values[PropertyId.MAXIMUM_PACKET_SIZE] == 520 * 1024
        largest[0] = 256 * 1024  # lowered again: the open connection keeps what it was told (the store holds
        big = encode(Publish("devices/dev1/messages/events/", b"x" * (300 * 1024), 1, packet_id=1), MQTT_50)
        kept.send_raw(big)  # each message to its routes' limits; this in-memory hub has none)
        assert await kept.next() == PubAck(1)
        await kept.close()

        c = await RawClient.open(port, level=MQTT_50)
        await c.login(dev_connect())
        c.send_raw(big[:1024])  # its header and a little: refused from the header, the body never sent
        answer = await c.next()
        assert isinstance(answer, Disconnect)
        assert answer.reason_code == ReasonCode.PACKET_TOO_LARGE
        assert await c.closed_by_server()
        await c.close()
        await polled(lambda: server.refusals.total >= 1)
    assert [m.body[:1] for _, m in hub.stored] == [b"x"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused reason=packet_too_large ")]
    assert len(lines) == 1, lines
    assert f"packet of {len(big)} bytes is over the limit of {264 * 1024}" in lines[0]


async def test_paho_publishing_a_message_over_the_bound_is_told_packet_too_large(hub: InMemoryHub) -> None:
    # paho writes the whole packet: the hub refuses it from its header, shuts its side and drops the rest as it
    # comes until paho hangs up. Closed at once, the socket would answer the rest with a reset, and paho would fail
    # on it before it read the DISCONNECT and its reason.
    settings = MqttSettings(tcp_port=0, tls_port=None, largest_message_size=lambda: 256 * 1024)
    async with MqttServer(hub, settings=settings) as server:
        for _ in range(3):
            client = Paho.make(DEV.id, protocol=MQTTProtocolVersion.MQTTv5)
            try:
                await client.connect(server.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
                client.publish("devices/dev1/messages/events/", b"x" * (4 << 20))
                async with asyncio.timeout(10):
                    reason = await client.disconnects.get()
                assert reason.value == ReasonCode.PACKET_TOO_LARGE
            finally:
                await client.close()
    assert hub.stored == []


@pytest.mark.parametrize("how", ["disconnect", "hang_up", "refused_login"])
async def test_a_client_that_goes_lets_go_of_its_socket_at_once_not_after_the_grace(hub: InMemoryHub, how: str) -> None:
    # The lingering close ends when the client hangs up: a DISCONNECT (the hub shuts its side first, then the
    # client's EOF), a bare hang-up (the client's EOF first), a refused login (the hub's CONNACK, then the client
    # goes). Waiting out close_grace_s instead would hold every closed connection's place that long.
    settings = MqttSettings(tcp_port=0, tls_port=None, close_grace_s=120.0)
    async with MqttServer(hub, settings=settings) as server:
        c = await RawClient.open(server.ports["tcp"], level=MQTT_50)
        ack = await c.login(dev_connect(password="wrong" if how == "refused_login" else None))
        assert isinstance(ack, ConnAck)
        if how == "disconnect":
            c.send(Disconnect())
        elif how == "refused_login":
            assert await c.closed_by_server()
        await c.close()
        await polled(lambda: server.limiter.total == 0, timeout_s=30.0)


def test_the_bound_never_passes_the_heads_own_max_packet_size() -> None:
    settings = MqttSettings(tcp_port=0, tls_port=None, max_packet_size=4096, largest_message_size=lambda: 512 * 1024)
    assert settings.read_bound(settings.max_packet_size) == 4096
    assert MqttSettings(tcp_port=0, tls_port=None).read_bound(4096) == 4096  # no deployment: the cap alone
