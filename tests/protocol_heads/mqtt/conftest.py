"""Fixtures for the MQTT head: an in-memory hub, a test CA, the head on 127.0.0.1 port 0 (TCP and TLS), and a
paho-mqtt 2.x client bridged into asyncio (its callbacks land on an asyncio queue)."""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.properties import Properties as PahoProperties

from edgehub.core import Identity
from edgehub.core.sas import generate_sas_token, resource_uri
from edgehub.testing import InMemoryHub
from edgehub.testing.certs import TestCA
from protocol_heads.mqtt.server import MqttServer, MqttSettings

HOST = "edgehub.local"
DEVICE_KEY = base64.b64encode(b"device key for dev1, 32 bytes!!").decode()
MODULE_KEY = base64.b64encode(b"module key for dev1/filter.....").decode()
DEV = Identity.parse("dev1")
MOD = Identity.parse("dev1/filter")


def sas_password(identity: Identity, key: str, *, expiry_s: int = 4_000_000_000) -> str:
    return generate_sas_token(resource_uri(HOST, identity), key, expiry_s)


def username(identity: Identity) -> str:
    return f"{HOST}/{identity.id}/?api-version=2021-04-12"


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "certs")


@pytest.fixture
def hub() -> InMemoryHub:
    h = InMemoryHub(host_name=HOST)
    h.add_identity(DEV, key_b64=DEVICE_KEY)
    h.add_identity(MOD, key_b64=MODULE_KEY)
    h.add_identity(Identity.parse("plain"), password=b"secret")
    return h


def server_context(ca: TestCA) -> ssl.SSLContext:
    pair = ca.server()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pair.cert, pair.key)
    ctx.load_verify_locations(ca.ca_pem)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


@pytest.fixture
async def head(hub: InMemoryHub, ca: TestCA) -> AsyncIterator[MqttServer]:
    settings = MqttSettings(tcp_port=0, tls_port=0, ssl_context=server_context(ca), connect_timeout_s=5.0)
    async with MqttServer(hub, settings=settings) as server:
        yield server


@dataclass
class Paho:
    """A paho client whose callbacks are put on asyncio queues of the test's loop."""

    client: mqtt.Client
    loop: asyncio.AbstractEventLoop
    connects: asyncio.Queue[Any]
    publishes: asyncio.Queue[tuple[int, int]]
    messages: asyncio.Queue[mqtt.MQTTMessage]
    disconnects: asyncio.Queue[Any]
    subscribes: asyncio.Queue[list[Any]]
    gone: bool = False  # set by paho's thread once the connection is over

    @classmethod
    def make(
        cls,
        client_id: str,
        *,
        protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv311,
        clean_session: bool | None = None,
        websocket_path: str | None = None,
    ) -> Paho:
        """``websocket_path``: MQTT over a WebSocket to that path (paho's ``transport="websockets"``)."""
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            clean_session=clean_session,
            transport="tcp" if websocket_path is None else "websockets",
        )
        if websocket_path is not None:
            client.ws_set_options(path=websocket_path)
        p = cls(
            client,
            asyncio.get_running_loop(),
            asyncio.Queue(),
            asyncio.Queue(),
            asyncio.Queue(),
            asyncio.Queue(),
            asyncio.Queue(),
        )

        def put(q: asyncio.Queue[Any], item: Any) -> None:
            p.loop.call_soon_threadsafe(q.put_nowait, item)

        client.reconnect_delay_set(60, 120)  # a test never wants paho to reconnect behind its back
        client.on_connect = lambda c, u, flags, rc, props: put(p.connects, rc)
        client.on_publish = lambda c, u, mid, rc, props: put(p.publishes, (mid, rc.value))
        client.on_message = lambda c, u, msg: put(p.messages, msg)

        def on_disconnect(c: mqtt.Client, u: object, flags: object, rc: object, props: object) -> None:
            p.gone = True
            put(p.disconnects, rc)

        client.on_disconnect = on_disconnect
        client.on_subscribe = lambda c, u, mid, rcs, props: put(p.subscribes, [r.value for r in rcs])
        return p

    async def connect(
        self, port: int, *, tls_ca: Path | None = None, user: str | None = None, password: str | None = None
    ) -> Any:
        if tls_ca is not None:
            self.client.tls_set(ca_certs=str(tls_ca))
        if user is not None:
            self.client.username_pw_set(user, password)
        await asyncio.to_thread(self.client.connect, "127.0.0.1", port, 30)
        self.client.loop_start()
        async with asyncio.timeout(10):
            return await self.connects.get()

    def publish(self, topic: str, payload: bytes, qos: int = 1, properties: PahoProperties | None = None) -> int:
        info = self.client.publish(topic, payload, qos=qos, properties=properties)
        return info.mid

    async def close(self) -> None:
        """Disconnect, wait until paho has let go of its socket, then stop its thread."""
        if not self.gone:
            self.client.disconnect()
            async with asyncio.timeout(10):
                await self.disconnects.get()
        await asyncio.to_thread(self.client.loop_stop)
        sock = self.client.socket()
        if sock is not None:
            sock.close()
        # paho 2.1 leaves the wake-up socket pair of loop_start() open (found with PYTHONTRACEMALLOC);
        # close it so that warnings-as-errors do not blame a later test.
        for name in ("_sockpairR", "_sockpairW"):
            pair_end = getattr(self.client, name, None)
            if isinstance(pair_end, socket.socket):
                pair_end.close()
                setattr(self.client, name, None)
