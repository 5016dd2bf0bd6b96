"""The twin and direct methods over AMQP, on IoT Hub's links and annotations (``twin_methods.py``), through the
real hub (RocksDB store in tmp_path, the AMQP head on 127.0.0.1 port 0) and proton's own client, which sends what
the Azure SDKs send: a twin request's ``operation``/``resource`` annotations and correlation id, a method answer's
``IoThub-status``. The rules are the hub's, so the answers are those the MQTT head gives: 200/204/400/413 for the
twin, 404 for a target that does not listen, 504 for one that does not answer."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from proton import Link, symbol
from proton import Message as AmqpMessage
from proton.utils import BlockingReceiver, BlockingSender, SendException

from edgehub.core import Identity
from edgehub.core.methods import MethodCall
from edgehub.hub.facade import EdgeHub
from edgehub.hub.methods import MethodLimits
from edgehub.routing import Router
from edgehub.store.rocks import open_rocks_store
from protocol_heads.amqp import AmqpServer, AmqpSettings
from protocol_heads.amqp.twin_methods import REQUEST_CREDIT
from tests.protocol_heads.amqp.conftest import (
    DEV,
    DEVICE_KEY,
    HOST,
    MOD,
    MODULE_KEY,
    EngineClient,
    ProtonClient,
    receive,
    sas_token,
)

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

OTHER = Identity.parse("dev2")
OTHER_KEY = base64.b64encode(b"device key for dev2, 32 bytes!!").decode()
CHANNEL = symbol("com.microsoft:channel-correlation-id")
LIMITS = MethodLimits(min_timeout_s=0.1, max_timeout_s=20.0)


@asynccontextmanager
async def served(data: Path) -> AsyncIterator[tuple[EdgeHub, AmqpServer]]:
    store = open_rocks_store(data / "store")
    try:
        router = Router({"up": "FROM /messages/* INTO $upstream"})
        async with EdgeHub(store=store, router=router, host_name=HOST, method_limits=LIMITS) as hub:
            for identity, key in ((DEV, DEVICE_KEY), (MOD, MODULE_KEY), (OTHER, OTHER_KEY)):
                await hub.identities.add_symmetric_key(identity, key)
            settings = AmqpSettings(tcp_port=0, tls_port=None, connect_timeout_s=5.0)
            async with AmqpServer(hub, settings=settings) as server:
                yield hub, server
    finally:
        await store.close()


class _Properties:
    """A proton link option (proton is untyped, so not its ``LinkOption`` subclass): the attach's properties, as
    the SDKs set ``com.microsoft:channel-correlation-id``."""

    def __init__(self, properties: dict[symbol, str]) -> None:
        self.properties = properties

    def test(self, link: Link) -> bool:
        return True

    def apply(self, link: Link) -> None:
        link.properties = self.properties


@dataclass
class Pair:
    """One client's two links on one address (the SDKs' twin and method channels)."""

    client: ProtonClient
    sender: BlockingSender
    receiver: BlockingReceiver

    async def send(self, message: AmqpMessage) -> None:
        await self.client.send(self.sender, message)

    async def receive(self) -> AmqpMessage:
        return await receive(self.receiver)


async def login(server: AmqpServer, hub: EdgeHub, identity: Identity, key: str) -> ProtonClient:
    who = identity.device_id if identity.module_id is None else f"{identity.device_id}/{identity.module_id}"
    token = sas_token(identity, key, expiry_s=int(hub.clock.time()) + 3600)
    return await ProtonClient.connect(server.ports["amqp"], user=f"{who}@sas.{HOST}", password=token)


async def pair(client: ProtonClient, address: str, channel: str = "twin:1") -> Pair:
    options = _Properties({CHANNEL: channel})
    sender = await asyncio.to_thread(client.conn.create_sender, address, None, f"{address} out", options)
    receiver = await asyncio.to_thread(client.conn.create_receiver, address, 10, False, None, f"{address} in", options)
    return Pair(client, sender, receiver)


def twin_request(operation: str, cid: str, resource: str | None = None, body: bytes | None = None) -> AmqpMessage:
    message = AmqpMessage(correlation_id=cid)
    annotations: dict[symbol, Any] = {symbol("operation"): operation}
    if resource is not None:
        annotations[symbol("resource")] = resource
    message.annotations = annotations
    if body is not None:
        message.body = body
        message.inferred = True
    return message


def status(message: AmqpMessage) -> int:
    value = message.annotations["status"]
    assert isinstance(value, int)
    return value


async def test_a_device_gets_its_twin_and_patches_its_reported_properties_over_amqp(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server):
        client = await login(server, hub, DEV, DEVICE_KEY)
        try:
            twin = await pair(client, "/devices/dev1/twin", "twin:abc")
            # The hub echoes the channel's correlation id, as IoT Hub does.
            assert twin.sender.link.remote_properties == {CHANNEL: "twin:abc"}
            await twin.send(twin_request("GET", "get-1", body=b" "))
            got = await twin.receive()
            assert got.correlation_id == "get-1"
            assert status(got) == 200
            assert json.loads(bytes(got.body)) == {"desired": {"$version": 1}, "reported": {"$version": 1}}

            patch = b'{"firmware": "1.2", "nested": {"a": 1}}'
            await twin.send(twin_request("PATCH", "patch-1", "/properties/reported", patch))
            answer = await twin.receive()
            assert answer.correlation_id == "patch-1"
            assert status(answer) == 204
            assert answer.annotations["version"] == 2
            assert answer.body is None
        finally:
            await client.close()
        reported = (await hub.get_twin(DEV))["reported"]
        assert reported == {"firmware": "1.2", "nested": {"a": 1}, "$version": 2}


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (twin_request("PATCH", "p", "/properties/reported", b"not json"), 400),
        (twin_request("PATCH", "p", "/properties/reported", b'{"a": ' * 20 + b"1" + b"}" * 20), 400),
        (twin_request("PATCH", "p", "/properties/reported", b'{"big": "' + b"x" * 40_000 + b'"}'), 413),
        (twin_request("PATCH", "p", "/properties/desired", b"{}"), 400),  # a device never writes desired
        (twin_request("POST", "p"), 400),
    ],
    ids=["not-json", "too-deep", "too-large", "desired", "unknown-operation"],
)
async def test_a_twin_request_the_hub_refuses_is_answered_with_iot_hubs_status_and_changes_nothing(
    tmp_path: Path, request_: AmqpMessage, expected: int
) -> None:
    async with served(tmp_path) as (hub, server):
        client = await login(server, hub, DEV, DEVICE_KEY)
        try:
            twin = await pair(client, "/devices/dev1/twin")
            await twin.send(request_)
            answer = await twin.receive()
            assert answer.correlation_id == "p"
            assert status(answer) == expected
            # The connection goes on: the next request is answered.
            await twin.send(twin_request("GET", "after"))
            assert status(await twin.receive()) == 200
        finally:
            await client.close()
        assert (await hub.get_twin(DEV))["reported"] == {"$version": 1}


async def test_a_module_subscribed_to_desired_properties_gets_each_patch_until_it_unsubscribes(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server):
        hub.set_module_desired("filter", {"threshold": 25}, 2)
        client = await login(server, hub, MOD, MODULE_KEY)
        try:
            twin = await pair(client, "/devices/dev1/modules/filter/twin")
            await twin.send(twin_request("GET", "g"))
            got = await twin.receive()
            assert json.loads(bytes(got.body))["desired"] == {"threshold": 25, "$version": 2}

            hub.set_module_desired("filter", {"threshold": 26}, 3)  # not subscribed yet: not sent
            await twin.send(twin_request("PUT", "sub", "/notifications/twin/properties/desired", b" "))
            answer = await twin.receive()
            assert (answer.correlation_id, status(answer)) == ("sub", 200)

            hub.set_module_desired("filter", {"threshold": 30, "unit": "C"}, 4)
            patch = await twin.receive()
            assert patch.correlation_id is None  # what tells the SDKs a patch from an answer
            assert json.loads(bytes(patch.body)) == {"threshold": 30, "unit": "C", "$version": 4}
            assert patch.annotations["version"] == 4

            await twin.send(twin_request("DELETE", "unsub", "/notifications/twin/properties/desired", b" "))
            answer = await twin.receive()
            assert (answer.correlation_id, status(answer)) == ("unsub", 200)
            hub.set_module_desired("filter", {"threshold": 31}, 5)
            await twin.send(twin_request("GET", "g2"))
            after = await twin.receive()  # the GET's answer: no patch came before it
            assert after.correlation_id == "g2"
            assert json.loads(bytes(after.body))["desired"] == {"threshold": 31, "$version": 5}
        finally:
            await client.close()


async def test_twin_and_method_links_of_another_identity_are_refused_with_unauthorized_access(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server):
        client = await login(server, hub, DEV, DEVICE_KEY)
        try:
            for address in ("/devices/dev2/twin", "/devices/dev1/modules/filter/methods/devicebound"):
                with pytest.raises(Exception, match="unauthorized-access"):
                    await client.sender(address)
        finally:
            await client.close()


async def test_a_second_twin_link_the_same_way_is_refused_with_not_allowed(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server):
        client = await login(server, hub, DEV, DEVICE_KEY)
        try:
            twin = await pair(client, "/devices/dev1/twin")
            with pytest.raises(Exception, match="not-allowed"):
                await client.sender("/devices/dev1/twin", name="second")
            await twin.send(twin_request("GET", "still"))  # the first pair still serves
            assert status(await twin.receive()) == 200
        finally:
            await client.close()


@pytest.mark.parametrize(
    ("identity", "key", "address"),
    [
        (DEV, DEVICE_KEY, "/devices/dev1/methods/devicebound"),
        (MOD, MODULE_KEY, "/devices/dev1/modules/filter/methods/devicebound"),
    ],
    ids=["device", "module"],
)
async def test_a_client_answers_a_direct_method_call_over_its_method_links(
    tmp_path: Path, identity: Identity, key: str, address: str
) -> None:
    async with served(tmp_path) as (hub, server):
        client = await login(server, hub, identity, key)
        try:
            methods = await pair(client, address, "methods:1")
            call = asyncio.create_task(hub.invoke_method("$upstream", identity, MethodCall("reboot", b'{"in": 5}', 10)))
            request = await methods.receive()
            assert request.properties == {"IoThub-methodname": "reboot"}
            assert bytes(request.body) == b'{"in": 5}'
            answer = AmqpMessage(body=b'{"ok": true}', inferred=True, correlation_id=request.correlation_id)
            answer.properties = {"IoThub-status": 201}
            await methods.send(answer)
            async with asyncio.timeout(10):
                result = await call
        finally:
            await client.close()
    assert result.status == 201
    assert json.loads(result.payload) == {"ok": True}


async def test_a_method_for_a_device_without_method_links_is_404_and_for_a_silent_one_504(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server):
        client = await login(server, hub, DEV, DEVICE_KEY)
        try:
            await client.sender("/devices/dev1/messages/events")  # connected, but not listening for methods
            async with asyncio.timeout(1):  # far less than the call's timeout: answered at once
                away = await hub.invoke_method("$upstream", DEV, MethodCall("reboot", b"{}", 10))
            assert away.status == 404

            methods = await pair(client, "/devices/dev1/methods/devicebound")
            call = asyncio.create_task(hub.invoke_method("$upstream", DEV, MethodCall("reboot", b"{}", 0.3)))
            request = await methods.receive()
            async with asyncio.timeout(10):
                silent = await call
            assert silent.status == 504
            late = AmqpMessage(body=b"{}", inferred=True, correlation_id=request.correlation_id)
            late.properties = {"IoThub-status": 200}
            with pytest.raises(SendException):  # no call waits for it: rejected
                await methods.send(late)
        finally:
            await client.close()


async def test_twin_answers_wait_for_the_clients_credit_and_hold_back_its_request_credit(tmp_path: Path) -> None:
    async with served(tmp_path) as (hub, server):
        token = sas_token(DEV, DEVICE_KEY, expiry_s=int(hub.clock.time()) + 3600)
        client = await EngineClient.connect(server.ports["amqp"], f"dev1@sas.{HOST}", token)
        try:
            answers = client.session.receiver("twin-in")
            answers.source.address = "/devices/dev1/twin"
            answers.open()  # no credit: the hub may not answer yet
            requests = client.sender("/devices/dev1/twin", "twin-out")
            await client.pump_until(lambda: requests.credit == REQUEST_CREDIT)
            for n in range(REQUEST_CREDIT):
                requests.delivery(f"r{n}")
                requests.send(twin_request("GET", f"get-{n}").encode())
                requests.advance()
            await client.pump_until(lambda: requests.credit == 0)
            # Nothing is answered and no request credit comes back while the answers wait: a client that never
            # gives credit holds at most REQUEST_CREDIT answers in the hub.
            assert answers.queued == 0
            answers.flow(REQUEST_CREDIT)
            await client.pump_until(lambda: answers.queued == REQUEST_CREDIT and requests.credit == REQUEST_CREDIT)
            got = []
            while (delivery := answers.current) is not None:
                message = AmqpMessage()
                message.decode(answers.recv(delivery.pending))
                answers.advance()
                got.append(message)
        finally:
            await client.close()
    assert [(m.correlation_id, status(m)) for m in got] == [(f"get-{n}", 200) for n in range(REQUEST_CREDIT)]
