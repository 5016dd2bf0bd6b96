"""Lines an outside party can cause are bounded as refusals are: a device that logs in again and again, and a
caller that calls a target that is away again and again, each log at most the rate limiter's burst in a window,
and the next line says how many were held back. The real hub (RocksDB in tmp_path) and the MQTT head on
127.0.0.1 port 0."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from edgehub.core import Message
from edgehub.core.methods import MethodCall
from edgehub.hub.facade import EdgeHub
from edgehub.hub.methods import UPSTREAM_CALLER
from edgehub.mqtt.packets import MQTT_311, ConnAck, Connect
from edgehub.routing import Router
from edgehub.store.rocks import open_rocks_store
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.hub.test_poison_messages import connected
from tests.hub.test_poison_messages import served as served_with_module
from tests.protocol_heads.mqtt.conftest import DEV, DEVICE_KEY, HOST, MOD, MODULE_KEY, sas_password, username
from tests.protocol_heads.mqtt.rawclient import RawClient

pytestmark = [pytest.mark.timeout(60)]

BURST = 5  # RateLimitedLog's default: lines per peer per minute
TRIES = 20


@asynccontextmanager
async def served(data: Path) -> AsyncIterator[tuple[EdgeHub, MqttServer]]:
    store = open_rocks_store(data / "store")
    try:
        router = Router({"telemetry": "FROM /messages/* INTO $upstream"})
        async with EdgeHub(store=store, router=router, host_name=HOST) as hub:
            await hub.identities.add_symmetric_key(DEV, DEVICE_KEY)
            await hub.identities.add_symmetric_key(MOD, MODULE_KEY)
            async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
                yield hub, server
    finally:
        await store.close()


def lines(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(event + " ")]


async def test_a_device_that_logs_in_again_and_again_logs_at_most_the_limiters_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with served(tmp_path) as (hub, server):
        password = sas_password(DEV, DEVICE_KEY, expiry_s=int(hub.clock.time()) + 3600).encode()
        for _ in range(TRIES):
            c = await RawClient.open(server.ports["tcp"], level=MQTT_311)
            ack = await c.login(Connect(DEV.id, protocol_level=MQTT_311, username=username(DEV), password=password))
            assert ack == ConnAck(0, False)
            await c.close()
    assert len(lines(caplog, "mqtt.connected")) == BURST
    # The hub's connects and disconnects of one identity share its budget.
    hub_lines = lines(caplog, "hub.device_connected") + lines(caplog, "hub.device_disconnected")
    assert 0 < len(hub_lines) <= BURST


async def test_calls_to_a_target_that_is_away_log_at_most_the_limiters_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with served(tmp_path) as (hub, _):
        for _ in range(TRIES):
            result = await hub.invoke_method(UPSTREAM_CALLER, MOD, MethodCall("m", b"{}", 10))
            assert result.status == 404
    assert len(lines(caplog, "method.not_online")) == BURST


async def test_cloud_to_device_messages_for_one_device_log_at_most_the_limiters_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with served(tmp_path) as (hub, _):
        for i in range(TRIES):
            await hub.cloud_to_device("dev1", Message(b"cmd", {"n": str(i)}, {"messageId": f"c{i}"}))
        assert hub.c2d.accepted == TRIES  # every one taken; only the lines are bounded
    accepted = lines(caplog, "c2d.accepted")
    assert len(accepted) == BURST


async def test_poison_messages_are_all_dead_lettered_and_counted_but_log_at_most_the_limiters_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    store = open_rocks_store(tmp_path / "store")
    inbox = "/modules/filter/inputs/in"
    try:
        router = Router({"to_filter": f"FROM /messages/* INTO BrokeredEndpoint('{inbox}')"})
        async with EdgeHub(store=store, router=router, host_name=HOST) as hub:
            await hub.identities.add_symmetric_key(DEV, DEVICE_KEY)
            await hub.identities.add_symmetric_key(MOD, MODULE_KEY)
            async with MqttServer(hub, settings=MqttSettings(tcp_port=0, tls_port=None)) as server:
                module = await connected(server, MOD, MODULE_KEY, "devices/dev1/modules/filter/inputs/#")
                # Each one's topic would pass MQTT's 65,535 bytes: dead-lettered at once, never sent.
                poison = [Message(b"p", {"a": "é" * 40_000}, {"messageId": f"p{i}"}) for i in range(TRIES)]
                await hub.ingest(DEV, poison)
                async with asyncio.timeout(20):
                    await hub.executors[inbox].wait_for(lambda: len(store.dead_letters(inbox)) == TRIES)
                    await hub.executors[inbox].wait_idle()  # the last one's line is written once the pump idles
                await module.close()
    finally:
        await store.close()
    assert len(lines(caplog, "store.dead_lettered")) == BURST


async def test_a_module_that_comes_and_goes_again_and_again_logs_at_most_the_limiters_reachability_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with served_with_module(tmp_path) as (hub, server, _):
        await hub.ingest(DEV, [Message(b"for the module", {}, {})])  # something to send, so the executor runs
        for _ in range(TRIES):
            module = await connected(server, MOD, MODULE_KEY, "devices/dev1/modules/filter/inputs/#")
            await module.close()
        executor = hub.executors["/modules/filter/inputs/in"]
        async with asyncio.timeout(10):
            await executor.wait_for(lambda: not executor.reachable)
    went = lines(caplog, "executor.unreachable")
    came = lines(caplog, "executor.reachable")
    assert 1 <= len(went) <= BURST, went
    assert 1 <= len(came) <= BURST, came
