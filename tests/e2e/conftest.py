"""The whole hub on real sockets: RocksDB store in tmp_path, router, ``EdgeHub``, the MQTT head on 127.0.0.1
port 0 (TCP and TLS with a test CA), identities with symmetric keys; paho-mqtt 2.x clients from
``tests.protocol_heads.mqtt.conftest``."""

from __future__ import annotations

import base64
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgehub.core import Clock, Identity
from edgehub.core.sas import generate_sas_token, resource_uri
from edgehub.delivery import Endpoint, ExecutorSettings, RetryPolicy
from edgehub.hub.facade import EdgeHub
from edgehub.hub.lanes import UpstreamOptions
from edgehub.routing import Router, RouteSpec
from edgehub.store import QueuePolicy, Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing.certs import TestCA
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.e2e.hub_process import kill_leftovers

HOST = "edgehub.test"
DEV = Identity.parse("dev1")
SENSOR = Identity.parse("edge/sensor")
FILTER = Identity.parse("edge/filter")
KEYS = {
    ident.id: base64.b64encode(f"key of {ident.id}".encode().ljust(32, b".")).decode()
    for ident in (DEV, SENSOR, FILTER)
}
IN1 = "/modules/filter/inputs/in1"
ROUTES = {
    "devices": f"FROM /messages/* WHERE $connectionDeviceId = 'dev1' INTO BrokeredEndpoint('{IN1}')",
    "m2m": "FROM /messages/modules/sensor/outputs/out1 INTO BrokeredEndpoint('/modules/filter/inputs/fromsensor')",
}
# A retry wait far longer than any test: delivery that resumes quickly proves the wait was cut short.
LONG_WAIT = ExecutorSettings(retry_policy=RetryPolicy(minimum_delay_s=600.0, maximum_delay_s=600.0))


def sas(identity: Identity, key: str | None = None, *, clock: Clock | None = None) -> str:
    """A token valid for a day by ``clock`` (the hub's: a manual clock's time is not today's), well within the
    hub's maximum token lifetime."""
    now = clock.time() if clock is not None else time.time()
    return generate_sas_token(resource_uri(HOST, identity), key or KEYS[identity.id], int(now) + 86_400)


def username(identity: Identity) -> str:
    return f"{HOST}/{identity.id}/?api-version=2021-04-12"


@dataclass
class Rig:
    hub: EdgeHub
    server: MqttServer
    store: Store
    ca: TestCA

    @property
    def tcp(self) -> int:
        return self.server.ports["tcp"]

    @property
    def tls(self) -> int:
        return self.server.ports["tls"]


@asynccontextmanager
async def running_hub(
    data: Path,
    *,
    routes: Mapping[str, str | RouteSpec] = ROUTES,
    policies: Mapping[str, QueuePolicy] | None = None,
    settings: ExecutorSettings = LONG_WAIT,
    tls_port: int = 0,
    endpoints: Sequence[Endpoint] = (),
    upstream: UpstreamOptions | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[Rig]:
    """The hub with DEV, SENSOR and FILTER known by their KEYS; plain TCP on a free port, TLS on ``tls_port``
    (a free one unless given; ``OSError`` if it is taken)."""
    ca = TestCA(data / "certs")
    pair = ca.server()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pair.cert, pair.key)
    store = open_rocks_store(data / "store", endpoint_policies=dict(policies or {}), clock=clock)
    try:
        async with EdgeHub(
            store=store,
            router=Router(routes),
            host_name=HOST,
            executor_settings=settings,
            endpoints=endpoints,
            upstream=upstream,
            clock=clock,
        ) as hub:
            for ident in (DEV, SENSOR, FILTER):
                await hub.identities.add_symmetric_key(ident, KEYS[ident.id])
            mqtt = MqttSettings(tcp_port=0, tls_port=tls_port, ssl_context=ctx, connect_timeout_s=5.0)
            async with MqttServer(hub, settings=mqtt) as server:
                yield Rig(hub, server, store, ca)
    finally:
        await store.close()


@pytest.fixture(autouse=True)
def _no_hub_left_running() -> Iterator[None]:
    """A hub process a test started and, failing, never stopped is killed after it."""
    yield
    kill_leftovers()
