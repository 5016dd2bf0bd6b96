"""The MQTT head on real sockets with real foreign clients: paho-mqtt 2.x (3.1.1 and 5), amqtt's client and
mosquitto_pub/sub, over TCP and over TLS with a test CA, against the in-memory hub."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from urllib.parse import quote

import paho.mqtt.client as mqtt
import pytest
from amqtt.client import MQTTClient
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from edgehub.core import Identity, Message
from edgehub.core.refusals import RefusalReason
from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import Connect, Disconnect, ReasonCode, Will
from edgehub.testing import InMemoryHub
from edgehub.testing.certs import TestCA
from protocol_heads.mqtt.server import MqttServer
from tests.protocol_heads.mqtt.conftest import (
    DEV,
    DEVICE_KEY,
    HOST,
    MOD,
    MODULE_KEY,
    Paho,
    sas_password,
    username,
)

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]


async def test_paho_v311_device_telemetry_over_tls_is_stored_with_its_property_bag(
    head: MqttServer, hub: InMemoryHub, ca: TestCA
) -> None:
    dev = Paho.make("dev1")
    rc = await dev.connect(
        head.ports["tls"], tls_ca=ca.ca_pem, user=username(DEV), password=sas_password(DEV, DEVICE_KEY)
    )
    assert rc == 0
    mid = dev.publish("devices/dev1/messages/events/$.mid=m1&$.ct=application%2Fjson&temp%20unit=C", b'{"t": 21}')
    async with asyncio.timeout(10):
        assert await dev.publishes.get() == (mid, 0)
    [(identity, msg)] = hub.stored
    assert identity == DEV
    assert msg.body == b'{"t": 21}'
    assert msg.properties == {"temp unit": "C"}
    assert msg.system_properties["messageId"] == "m1"
    assert msg.system_properties["contentType"] == "application/json"
    assert msg.system_properties["connectionDeviceId"] == "dev1"
    assert msg.system_properties["connectionAuthMethod"] == "sas"
    await dev.close()


async def test_puback_waits_until_the_hub_says_durable(head: MqttServer, hub: InMemoryHub) -> None:
    dev = Paho.make("dev1")
    await dev.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    hub.hold()
    mids = [dev.publish("devices/dev1/messages/events/", bytes([i])) for i in range(5)]
    async with asyncio.timeout(10):
        await hub.wait_held(1)
    assert dev.publishes.empty()  # nothing acked while the store has not answered
    assert hub.stored == []
    hub.release()
    async with asyncio.timeout(10):
        acked = [await dev.publishes.get() for _ in mids]
    assert [m for m, _ in acked] == mids  # in arrival order
    assert [m.body for _, m in hub.stored] == [bytes([i]) for i in range(5)]
    await dev.close()


async def test_amqtt_client_gets_its_qos1_puback_over_tls_only_after_the_hub_says_durable(
    head: MqttServer, hub: InMemoryHub, ca: TestCA
) -> None:
    client = MQTTClient(client_id="dev1", config={"auto_reconnect": False, "keep_alive": 30})
    user, password = quote(username(DEV), safe=""), quote(sas_password(DEV, DEVICE_KEY), safe="")
    uri = f"mqtts://{user}:{password}@127.0.0.1:{head.ports['tls']}/"
    async with asyncio.timeout(10):
        assert await client.connect(uri, cafile=str(ca.ca_pem)) == 0
    hub.hold()
    publish = asyncio.create_task(client.publish("devices/dev1/messages/events/$.mid=a1&unit=%C2%B0C", b"amqtt", qos=1))
    stored_when_acked: list[int] = []
    publish.add_done_callback(lambda _: stored_when_acked.append(len(hub.stored)))
    async with asyncio.timeout(10):
        await hub.wait_held(1)
        await client.ping()  # a round trip on the same socket, while the message is not durable yet
    assert not publish.done()
    assert hub.stored == []
    hub.release()
    async with asyncio.timeout(10):
        sent = await publish
    assert sent.puback_packet is not None
    assert stored_when_acked == [1]  # amqtt's publish returned (PUBACK in hand) with the message already stored
    [(identity, msg)] = hub.stored
    assert identity == DEV
    assert msg.body == b"amqtt"
    assert msg.properties == {"unit": "°C"}
    assert msg.system_properties["messageId"] == "a1"
    async with asyncio.timeout(10):
        await client.disconnect()


async def test_paho_v5_gets_quota_exceeded_as_a_negative_puback_and_keeps_its_connection(
    head: MqttServer, hub: InMemoryHub
) -> None:
    dev = Paho.make("dev1", protocol=mqtt.MQTTv5)
    rc = await dev.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    assert rc == 0
    hub.refuse(RefusalReason.QUOTA_EXCEEDED)
    first = dev.publish("devices/dev1/messages/events/", b"refused")
    second = dev.publish("devices/dev1/messages/events/", b"kept")
    async with asyncio.timeout(10):
        got = [await dev.publishes.get(), await dev.publishes.get()]
    assert got == [(first, 0x97), (second, 0)]
    assert [m.body for _, m in hub.stored] == [b"kept"]
    await dev.close()


async def test_paho_v5_user_properties_and_content_type_become_message_properties(
    head: MqttServer, hub: InMemoryHub
) -> None:
    mod = Paho.make("dev1/filter", protocol=mqtt.MQTTv5)
    await mod.connect(head.ports["tcp"], user=username(MOD), password=sas_password(MOD, MODULE_KEY))
    props = PahoProperties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ContentType = "application/json"
    props.CorrelationData = b"req-7"
    props.UserProperty = [("$.on", "alerts"), ("severity", "high")]
    mid = mod.publish("devices/dev1/modules/filter/messages/events/", b"{}", properties=props)
    async with asyncio.timeout(10):
        assert await mod.publishes.get() == (mid, 0)
    [(_, msg)] = hub.stored
    assert msg.source == "/messages/modules/filter/outputs/alerts"
    assert msg.system_properties["contentType"] == "application/json"
    assert msg.system_properties["cid"] == "req-7"
    assert msg.properties == {"severity": "high"}
    await mod.close()


async def test_v311_client_publishing_as_another_device_is_disconnected_without_ack(
    head: MqttServer, hub: InMemoryHub
) -> None:
    dev = Paho.make("dev1")
    await dev.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    dev.publish("devices/dev2/messages/events/", b"spoof")
    async with asyncio.timeout(10):
        rc = await dev.disconnects.get()
    assert rc != 0
    assert dev.publishes.empty()
    assert hub.stored == []
    await dev.close()


async def test_bad_sas_key_is_refused_at_connect(head: MqttServer) -> None:
    dev = Paho.make("dev1", protocol=mqtt.MQTTv5)
    rc = await dev.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, MODULE_KEY))
    assert rc.value == 0x87
    await dev.close()


async def test_module_receives_enqueued_input_messages_and_its_pubacks_reach_the_hub(
    head: MqttServer, hub: InMemoryHub
) -> None:
    mod = Paho.make("dev1/filter")
    await mod.connect(head.ports["tcp"], user=username(MOD), password=sas_password(MOD, MODULE_KEY))
    mod.client.subscribe("devices/dev1/modules/filter/inputs/#", qos=1)
    async with asyncio.timeout(10):
        assert await mod.subscribes.get() == [1]
    msg = Message(b"hello", {"k": "v"}, {"messageId": "x1", "connectionDeviceId": "dev1", "connectionModuleId": "s"})
    ids = [hub.enqueue(MOD, "input1", msg) for _ in range(3)]
    async with asyncio.timeout(10):
        got = [await mod.messages.get() for _ in ids]
        await hub.wait_acked(3)
    assert got[0].topic == "devices/dev1/modules/filter/inputs/input1/$.mid=x1&$.cdid=dev1&$.cmid=s&k=v"
    assert got[0].payload == b"hello"
    assert [a[1] for a in hub.acked] == ids
    assert hub.pending(MOD) == 0
    await mod.close()


async def test_deliveries_in_flight_are_redelivered_after_a_reconnect(head: MqttServer, hub: InMemoryHub) -> None:
    # A raw client that never acks, then disconnects: the hub must send the message again to the next link.
    reader, writer = await asyncio.open_connection("127.0.0.1", head.ports["tcp"])
    writer.write(
        encode(Connect("dev1/filter", username=username(MOD), password=sas_password(MOD, MODULE_KEY).encode()))
    )
    decoder = Decoder(protocol_level=4)
    async with asyncio.timeout(10):
        while not decoder.receive_data(await reader.read(1024)):
            pass
        hub.enqueue(MOD, "in", Message(b"once"))
        got: list[object] = []
        while not got:
            got = list(decoder.receive_data(await reader.read(1024)))
    writer.close()
    await writer.wait_closed()
    mod = Paho.make("dev1/filter", clean_session=False)
    await mod.connect(head.ports["tcp"], user=username(MOD), password=sas_password(MOD, MODULE_KEY))
    async with asyncio.timeout(10):
        again = await mod.messages.get()
        await hub.wait_acked(1)
    assert again.payload == b"once"
    assert again.dup
    await mod.close()


async def test_twin_get_and_reported_patch_are_answered(head: MqttServer, hub: InMemoryHub) -> None:
    dev = Paho.make("dev1")
    await dev.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    dev.client.subscribe("$iothub/twin/res/#", qos=0)
    async with asyncio.timeout(10):
        await dev.subscribes.get()
        dev.publish("$iothub/twin/GET/?$rid=1", b"", qos=0)
        res = await dev.messages.get()
        assert res.topic == "$iothub/twin/res/200/?$rid=1"
        assert b'"reported"' in res.payload
        dev.publish("$iothub/twin/PATCH/properties/reported/?$rid=2", b'{"fw": "1.2"}', qos=0)
        res = await dev.messages.get()
    assert res.topic == "$iothub/twin/res/204/?$rid=2&$version=2"
    assert hub.twins["dev1"]["reported"]["fw"] == "1.2"
    assert hub.stored == []  # twin traffic is not telemetry
    await dev.close()


async def test_session_takeover_closes_the_older_connection(head: MqttServer) -> None:
    first = Paho.make("dev1", protocol=mqtt.MQTTv5)
    await first.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    first.client.reconnect_delay_set(60, 120)  # do not fight the takeover
    second = Paho.make("dev1", protocol=mqtt.MQTTv5)
    await second.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    async with asyncio.timeout(10):
        rc = await first.disconnects.get()
    assert rc.value == 0x8E
    assert head.connected == ["dev1"]
    await first.close()
    await second.close()


async def test_connect_that_never_comes_closes_the_socket(hub: InMemoryHub, ca: TestCA) -> None:
    from protocol_heads.mqtt.server import MqttSettings

    settings = MqttSettings(tcp_port=0, tls_port=None, connect_timeout_s=0.3)
    async with MqttServer(hub, settings=settings) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.ports["tcp"])
        async with asyncio.timeout(10):
            assert await reader.read() == b""
        writer.close()
        await writer.wait_closed()


async def test_a_garbage_client_does_not_disturb_another(head: MqttServer, hub: InMemoryHub) -> None:
    dev = Paho.make("dev1")
    await dev.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    reader, writer = await asyncio.open_connection("127.0.0.1", head.ports["tcp"])
    writer.write(b"\x10\xff\xff\xff\xff\x7f garbage")
    async with asyncio.timeout(10):
        assert await reader.read() == b""
    writer.close()
    await writer.wait_closed()
    mid = dev.publish("devices/dev1/messages/events/", b"still here")
    async with asyncio.timeout(10):
        assert await dev.publishes.get() == (mid, 0)
    await dev.close()


async def test_pipelined_publishes_of_one_read_reach_the_hub_as_one_group(head: MqttServer, hub: InMemoryHub) -> None:
    from edgehub.mqtt.packets import Publish

    reader, writer = await asyncio.open_connection("127.0.0.1", head.ports["tcp"])
    connect = encode(Connect("dev1", username=username(DEV), password=sas_password(DEV, DEVICE_KEY).encode()))
    publishes = b"".join(
        encode(Publish("devices/dev1/messages/events/", bytes([i]), 1, packet_id=i + 1)) for i in range(20)
    )
    writer.write(connect + publishes)
    decoder = Decoder(protocol_level=4)
    acks: list[object] = []
    async with asyncio.timeout(10):
        while len(acks) < 21:
            acks += decoder.receive_data(await reader.read(4096))
    assert hub.groups == [20]
    assert [getattr(a, "packet_id", None) for a in acks[1:]] == list(range(1, 21))
    writer.close()
    await writer.wait_closed()


async def test_a_topic_used_again_gives_the_same_properties_and_twin_topics_stay_twin_requests(
    head: MqttServer, hub: InMemoryHub
) -> None:
    # The head remembers what a telemetry topic means for a connection; a repeat, in the same read or a later
    # one, must come out as the first did, and a twin topic must keep being answered, never stored.
    from edgehub.mqtt.packets import Publish, SubAck, Subscribe, Subscription

    telemetry = "devices/dev1/messages/events/$.mid=m1&$.ct=text%2Fplain&k=v%20w"
    twin = "$iothub/twin/PATCH/properties/reported/?$rid=1"
    reader, writer = await asyncio.open_connection("127.0.0.1", head.ports["tcp"])
    connect = encode(Connect("dev1", username=username(DEV), password=sas_password(DEV, DEVICE_KEY).encode()))
    writer.write(connect + encode(Subscribe(1, (Subscription("$iothub/twin/res/#", 0),))))
    decoder = Decoder(protocol_level=4)
    got: list[object] = []
    async with asyncio.timeout(10):
        while not any(isinstance(p, SubAck) for p in got):
            got += decoder.receive_data(await reader.read(4096))
        for round_ in range(2):  # two reads: the second finds the topics known
            writer.write(
                b"".join(
                    encode(p)
                    for p in (
                        Publish(telemetry, b"a%d" % round_, 1, packet_id=10 * round_ + 1),
                        Publish(twin, b'{"x": %d}' % round_, 1, packet_id=10 * round_ + 2),
                        Publish(telemetry, b"b%d" % round_, 1, packet_id=10 * round_ + 3),
                    )
                )
            )
            acks = 0
            while acks < 3:
                packets = decoder.receive_data(await reader.read(4096))
                acks += sum(1 for p in packets if not isinstance(p, Publish))
    assert [m.body for _, m in hub.stored] == [b"a0", b"b0", b"a1", b"b1"]

    def own(m: Message) -> dict[str, str]:  # what the head made of the PUBLISH (the hub stamps the rest)
        return {k: v for k, v in m.system_properties.items() if k not in ("edgeMessageId", "enqueuedTime")}

    first = hub.stored[0][1]
    for _, m in hub.stored:
        assert m.properties == {"k": "v w"}
        assert own(m) == own(first)
    assert first.system_properties["messageId"] == "m1"
    assert first.system_properties["contentType"] == "text/plain"
    assert hub.twins["dev1"]["reported"] == {"$version": 3, "x": 1}
    writer.close()
    await writer.wait_closed()


async def test_mosquitto_pub_and_sub_over_tls(head: MqttServer, hub: InMemoryHub, ca: TestCA) -> None:
    port = str(head.ports["tls"])
    tls = ["--cafile", str(ca.ca_pem), "-h", "127.0.0.1", "-p", port]
    sub = await asyncio.create_subprocess_exec(
        "mosquitto_sub",
        *tls,
        "-i",
        "dev1/filter",
        "-u",
        username(MOD),
        "-P",
        sas_password(MOD, MODULE_KEY),
        "-t",
        "devices/dev1/modules/filter/inputs/#",
        "-q",
        "1",
        "-C",
        "1",
        "-v",
        stdout=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(20):
        await hub.wait_connected(MOD)
        hub.enqueue(MOD, "in1", Message(b"to-sub"))
        out, _ = await sub.communicate()
    assert out.decode().strip() == "devices/dev1/modules/filter/inputs/in1/ to-sub"
    pub = await asyncio.create_subprocess_exec(
        "mosquitto_pub",
        *tls,
        "-i",
        "dev1",
        "-u",
        username(DEV),
        "-P",
        sas_password(DEV, DEVICE_KEY),
        "-t",
        "devices/dev1/messages/events/a=b",
        "-q",
        "1",
        "-m",
        "from-pub",
    )
    async with asyncio.timeout(20):
        assert await pub.wait() == 0
        await hub.wait_stored(1)
    [(_, msg)] = hub.stored
    assert msg.body == b"from-pub"
    assert msg.properties == {"a": "b"}


async def test_v311_client_is_disconnected_instead_of_a_negative_ack(head: MqttServer, hub: InMemoryHub) -> None:
    dev = Paho.make("dev1")
    dev.client.reconnect_delay_set(60, 120)
    await dev.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    hub.refuse(RefusalReason.QUOTA_EXCEEDED)
    dev.publish("devices/dev1/messages/events/", b"refused")
    async with asyncio.timeout(10):
        rc = await dev.disconnects.get()
    assert rc != 0
    assert dev.publishes.empty()
    await dev.close()


async def test_client_certificate_thumbprint_authenticates_over_tls(
    head: MqttServer, hub: InMemoryHub, ca: TestCA
) -> None:
    pair = ca.client("certdev")
    der = x509.load_pem_x509_certificate(pair.cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    hub.add_identity(Identity.parse("certdev"), thumbprint=hashlib.sha256(der).hexdigest())
    dev = Paho.make("certdev")
    dev.client.tls_set(ca_certs=str(ca.ca_pem), certfile=str(pair.cert), keyfile=str(pair.key))
    rc = await dev.connect(head.ports["tls"], user=f"{HOST}/certdev/?api-version=2021-04-12")
    assert rc == 0
    mid = dev.publish("devices/certdev/messages/events/", b"x")
    async with asyncio.timeout(10):
        assert await dev.publishes.get() == (mid, 0)
    assert hub.stored[0][1].system_properties["connectionAuthMethod"] == "x509"
    await dev.close()


async def test_silent_client_is_closed_after_one_and_a_half_keepalives(head: MqttServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", head.ports["tcp"])
    connect = Connect("dev1", keepalive_s=1, username=username(DEV), password=sas_password(DEV, DEVICE_KEY).encode())
    writer.write(encode(connect))
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(10):
        assert (await reader.read(4))[:1] == b"\x20"
        started = loop.time()
        assert await reader.read() == b""
    assert loop.time() - started >= 1.4
    writer.close()
    await writer.wait_closed()


@pytest.mark.parametrize(("goodbye", "will_stored"), [(b"", True), (encode(Disconnect()), False)])
async def test_will_is_published_only_when_the_client_vanishes(
    head: MqttServer, hub: InMemoryHub, goodbye: bytes, will_stored: bool
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", head.ports["tcp"])
    connect = Connect(
        "dev1",
        username=username(DEV),
        password=sas_password(DEV, DEVICE_KEY).encode(),
        will=Will("devices/dev1/messages/events/kind=will", b"gone"),
    )
    writer.write(encode(connect))
    async with asyncio.timeout(10):
        await reader.read(4)
        writer.write(goodbye)
        writer.close()
        await writer.wait_closed()
        await hub.wait_disconnected(DEV)
    assert [(m.body, m.properties) for _, m in hub.stored] == ([(b"gone", {"kind": "will"})] if will_stored else [])


async def test_store_failure_refuses_the_message_of_a_v5_client_and_keeps_the_connection(
    head: MqttServer, hub: InMemoryHub
) -> None:
    dev = Paho.make("dev1", protocol=mqtt.MQTTv5)
    await dev.connect(head.ports["tcp"], user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
    hub.fail_next_ingest()  # the disk said no (StorageIOError): a refusal with a reason, as a full queue's
    mid = dev.publish("devices/dev1/messages/events/", b"lost?")
    async with asyncio.timeout(10):
        assert await dev.publishes.get() == (mid, ReasonCode.QUOTA_EXCEEDED)
    assert hub.stored == []
    mid = dev.publish("devices/dev1/messages/events/", b"again")
    async with asyncio.timeout(10):
        assert await dev.publishes.get() == (mid, 0)
    assert not dev.gone
    assert [m.body for _, m in hub.stored] == [b"again"]
    await dev.close()


async def test_reading_pauses_while_max_groups_wait_on_the_hub_and_resumes_on_release(
    hub: InMemoryHub,
) -> None:
    from edgehub.mqtt.packets import PingReq, PingResp, PubAck, Publish
    from protocol_heads.mqtt.server import MqttSettings

    settings = MqttSettings(tcp_port=0, tls_port=None, max_groups_in_flight=2)
    async with MqttServer(hub, settings=settings) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.ports["tcp"])
        writer.write(encode(Connect("dev1", username=username(DEV), password=sas_password(DEV, DEVICE_KEY).encode())))
        decoder = Decoder(protocol_level=4)
        got: list[object] = []
        async with asyncio.timeout(10):
            while not got:
                got += decoder.receive_data(await reader.read(4096))
            hub.hold()
            for i in (1, 2):  # one read, one group each
                writer.write(encode(Publish("devices/dev1/messages/events/", b"m", 1, packet_id=i)))
                await hub.wait_held(i)
            writer.write(encode(Publish("devices/dev1/messages/events/", b"m", 1, packet_id=3)) + encode(PingReq()))
        # Two groups wait on the hub: the third PUBLISH and the PINGREQ after it are not read.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await reader.read(4096)
        assert hub.held_groups == 2
        hub.release()
        got = []
        async with asyncio.timeout(10):
            while len(got) < 4:
                got += decoder.receive_data(await reader.read(4096))
        acks = [p.packet_id for p in got if isinstance(p, PubAck)]
        assert acks == [1, 2, 3]
        assert sum(isinstance(p, PingResp) for p in got) == 1
        assert hub.groups == [1, 1, 1]
        writer.close()
        await writer.wait_closed()


async def test_a_client_that_talks_within_its_keepalive_stays_connected(head: MqttServer) -> None:
    from edgehub.mqtt.packets import PingReq, PingResp

    reader, writer = await asyncio.open_connection("127.0.0.1", head.ports["tcp"])
    connect = Connect("dev1", keepalive_s=1, username=username(DEV), password=sas_password(DEV, DEVICE_KEY).encode())
    writer.write(encode(connect))
    decoder = Decoder(protocol_level=4)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(10):
        assert (await reader.read(4))[:1] == b"\x20"
        started = loop.time()
        while loop.time() - started < 3.5:  # over twice the 1.5 s allowed for silence
            await asyncio.sleep(0.4)  # the client's own pace, well inside its keepalive
            writer.write(encode(PingReq()))
            packets: list[object] = []
            while not packets:
                data = await reader.read(4096)
                assert data, "closed although the client kept talking"
                packets += decoder.receive_data(data)
            assert [type(p) for p in packets] == [PingResp]
    writer.close()
    await writer.wait_closed()


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))  # Linux, as the hub's gateways are


async def polled(condition: Callable[[], bool]) -> None:
    """Until ``condition()`` holds (10 s at most): nothing signals that a connection's descriptors are closed."""
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110 (no event to wait for; polled, bounded)
            await asyncio.sleep(0.01)


async def test_connections_that_come_and_go_leave_no_descriptor_behind(head: MqttServer) -> None:
    """Each connection holds a second descriptor of its socket (for TCP_QUICKACK); it goes with the connection."""

    async def session() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", head.ports["tcp"])
        writer.write(encode(Connect("plain", username="plain", password=b"secret"), 4))
        async with asyncio.timeout(10):
            assert await reader.readexactly(4) == b"\x20\x02\x00\x00"  # CONNACK accepted
        writer.close()
        await writer.wait_closed()

    await session()  # whatever the first connection opens once (the loop's own machinery)
    await polled(lambda: not head.connected)
    before = open_descriptors()
    for _ in range(20):
        await session()
    await polled(lambda: not head.connected and open_descriptors() <= before)
