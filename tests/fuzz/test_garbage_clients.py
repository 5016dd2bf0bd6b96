"""The hub keeps serving while clients send garbage: the real MQTT head in process (in-memory hub) takes
random bytes, mutated packets and half packets followed by silence from several clients for a few seconds,
while a well-behaved paho device publishes QoS 1 and gets every PUBACK and a paho module gets every delivery.
At the end the head still takes new clients, every garbage connection was closed by the head, and no client
task crashed (``mqtt.client_crashed`` is what the head logs when one does)."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from edgehub.core import Identity, Message
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import MQTT_50, Connect, Properties, PropertyId, Publish, Subscribe, Subscription
from edgehub.testing import InMemoryHub
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, MOD, MODULE_KEY, Paho, sas_password, username

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

GARBAGE_CLIENTS = 6
GARBAGE_FOR_S = 3.0
PLAIN = Identity.parse("plain")


def _mutate(rng: random.Random, wire: bytes) -> bytes:
    out = bytearray(wire)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(out)) if out else 0
        how = rng.choice(["set", "flip", "insert", "delete"])
        if how == "set" and out:
            out[i] = rng.randrange(256)
        elif how == "flip" and out:
            out[i] ^= 1 << rng.randrange(8)
        elif how == "insert":
            out[i:i] = rng.randbytes(rng.randint(1, 4))
        elif out:
            del out[i]
    return bytes(out)


def _garbage(rng: random.Random) -> bytes:
    """One connection's bytes. Each kind ends in a close by the head: a protocol error at once, the connect
    timeout (no complete CONNECT) or the keepalive (a CONNECT with keepalive 1, then silence)."""
    level = rng.choice([4, MQTT_50])
    hello = encode(Connect("plain", level, keepalive_s=1, username="plain", password=b"secret"), level)
    props = Properties({PropertyId.CONTENT_TYPE: "json"}, (("k", "v"),)) if level == MQTT_50 else Properties()
    valid = [
        encode(
            Publish("devices/plain/messages/events/a=1", b"x" * rng.randint(0, 300), 1, packet_id=7, properties=props),
            level,
        ),
        encode(Publish("devices/plain/messages/events/", b"{}", 0), level),
        encode(Subscribe(3, (Subscription("devices/plain/messages/devicebound/#", 1),)), level),
        b"\xc0\x00",
    ]
    kind = rng.choice(["random", "mutated_stream", "mutated_connect", "half_connect", "half_publish"])
    if kind == "random":
        return rng.randbytes(rng.randint(1, 200))
    if kind == "mutated_stream":
        return hello + _mutate(rng, b"".join(rng.choices(valid, k=rng.randint(1, 4))))
    if kind == "mutated_connect":
        return _mutate(rng, hello) + b"\x00\x00"  # packet type 0 is reserved: broken even if the CONNECT is not
    if kind == "half_connect":
        return hello[: rng.randint(1, len(hello) - 1)]
    publish = rng.choice(valid[:2])
    return hello + publish[: rng.randint(1, len(publish) - 1)]


async def _garbage_client(port: int, seed: int, until: float) -> tuple[int, int]:
    """Garbage connections one after another until ``until``: (connections made, connections the head closed)."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    made = closed = 0
    while loop.time() < until:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        made += 1
        writer.write(_garbage(rng))
        try:
            async with asyncio.timeout(10):  # the connect timeout and 1.5 keepalives are 1 s and 1.5 s
                while await reader.read(65536):
                    pass
            closed += 1
        except ConnectionResetError:
            closed += 1
        except TimeoutError:
            pass
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionResetError:
            pass
    return made, closed


async def test_the_head_serves_a_device_and_a_module_while_clients_send_garbage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub = InMemoryHub(host_name=HOST)
    hub.add_identity(DEV, key_b64=DEVICE_KEY)
    hub.add_identity(MOD, key_b64=MODULE_KEY)
    hub.add_identity(PLAIN, password=b"secret")
    settings = MqttSettings(tcp_port=0, tls_port=None, connect_timeout_s=1.0, max_packet_size=4096)
    caplog.set_level(logging.INFO, logger="protocol_heads")
    async with MqttServer(hub, settings=settings) as head:
        port = head.ports["tcp"]
        device, module = Paho.make("dev1"), Paho.make("dev1/filter")
        await device.connect(port, user=username(DEV), password=sas_password(DEV, DEVICE_KEY))
        await module.connect(port, user=username(MOD), password=sas_password(MOD, MODULE_KEY))
        module.client.subscribe("devices/dev1/modules/filter/inputs/#", qos=1)
        async with asyncio.timeout(10):
            assert await module.subscribes.get() == [1]

        loop = asyncio.get_running_loop()
        until = loop.time() + GARBAGE_FOR_S
        garbage = [asyncio.create_task(_garbage_client(port, seed, until)) for seed in range(GARBAGE_CLIENTS)]
        published = delivered = 0
        while loop.time() < until:
            mid = device.publish("devices/dev1/messages/events/", f"m{published}".encode(), qos=1)
            async with asyncio.timeout(10):
                assert await device.publishes.get() == (mid, 0)
            published += 1
            if published % 4 == 0:
                hub.enqueue(MOD, "in", Message(f"d{delivered}".encode()))
                delivered += 1
        async with asyncio.timeout(30):
            outcomes = await asyncio.gather(*garbage)
            got = [await module.messages.get() for _ in range(delivered)]
            await hub.wait_acked(delivered)

        assert published >= 10
        assert [m.payload for m in got] == [f"d{i}".encode() for i in range(delivered)]
        assert [m.body for i, m in hub.stored if i == DEV] == [f"m{i}".encode() for i in range(published)]
        made = sum(m for m, _ in outcomes)
        assert made >= GARBAGE_CLIENTS
        assert [c for _, c in outcomes] == [m for m, _ in outcomes], "every garbage connection was closed by the head"
        late = Paho.make("late", protocol=MQTTProtocolVersion.MQTTv5)
        hub.add_identity(Identity.parse("late"), password=b"pw")
        rc = await late.connect(port, user="late", password="pw")
        assert rc.value == 0
        assert sorted(head.connected) == ["dev1", "dev1/filter", "late"]
        for client in (device, module, late):
            await client.close()
    crashed = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert crashed == []
    refused = [
        r.getMessage() for r in caplog.records if "protocol_error" in r.getMessage() or "refused" in r.getMessage()
    ]
    assert refused, "the garbage was seen and refused"
