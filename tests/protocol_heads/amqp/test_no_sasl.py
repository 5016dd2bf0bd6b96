"""A connection with no SASL layer, as the official Azure IoT SDKs open one: the plain AMQP header (protocol id 0)
over TLS or TCP, then a CBS ``put-token`` on ``$cbs`` before any other link. A link attached before a valid token
is refused with ``amqp:unauthorized-access``; a client that never sends one is closed at the login timeout; the
header is read byte by byte like the SASL one. (The bounds before login hold on this path too:
``test_before_login`` runs each of them without SASL as well.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from proton import Endpoint
from proton import Message as AmqpMessage

from edgehub.testing import InMemoryHub
from edgehub.testing.certs import TestCA
from protocol_heads.amqp import AmqpServer, AmqpSettings
from protocol_heads.amqp.sasl import AMQP_HEADER, SASL_HEADER, SaslError, SaslServer
from tests.protocol_heads.amqp.conftest import (
    DEV,
    DEVICE_KEY,
    HOST,
    MOD,
    MODULE_KEY,
    TIMEOUT_S,
    EngineClient,
    ProtonClient,
    put_token,
    sas_token,
)

pytestmark = pytest.mark.interop

LOG = "protocol_heads.amqp.server"
EVENTS = "/devices/dev1/messages/events"


def test_the_plain_amqp_header_skips_sasl_where_anonymous_is_offered_even_a_byte_at_a_time() -> None:
    sasl = SaslServer(["PLAIN", "ANONYMOUS"])
    sent = AMQP_HEADER + b"\x00\x00\x00\x20rest of the open"
    for i in range(len(AMQP_HEADER) - 1):
        assert sasl.receive_data(sent[i : i + 1]) is None
        assert not sasl.done
    assert sasl.receive_data(sent[len(AMQP_HEADER) - 1 :]) is None
    assert sasl.done
    assert sasl.skipped
    assert sasl.rest == sent  # proton's transport reads the header too
    assert sasl.data_to_send() == b""  # no SASL header, no mechanisms: the AMQP layer answers


def test_the_plain_amqp_header_is_refused_where_anonymous_is_not_offered() -> None:
    sasl = SaslServer(["EXTERNAL", "PLAIN"])  # no CBS login here: the client must say who it is in SASL
    with pytest.raises(SaslError, match="not an AMQP header"):
        sasl.receive_data(AMQP_HEADER)
    assert sasl.data_to_send() == SASL_HEADER  # which protocol is spoken here (AMQP 1.0, 2.2)


@pytest.mark.parametrize(
    ("header", "wrong_at"), [(b"AMQP\x02\x01\x00\x00", 4), (b"AMQP\x00\x02\x00\x00", 5), (b"HTTP/1.1 GET", 0)]
)
def test_any_other_header_is_refused_at_its_first_wrong_byte(header: bytes, wrong_at: int) -> None:
    sasl = SaslServer(["PLAIN", "ANONYMOUS"])
    for i in range(wrong_at):
        assert sasl.receive_data(header[i : i + 1]) is None
    with pytest.raises(SaslError, match="not an AMQP header"):
        sasl.receive_data(header[wrong_at : wrong_at + 1])
    assert not sasl.done


async def test_a_device_without_sasl_logs_in_over_tls_with_a_cbs_token_and_its_telemetry_is_stored(
    head: AmqpServer, hub: InMemoryHub, ca: TestCA
) -> None:
    client = await ProtonClient.connect(head.ports["amqps"], ca=ca.ca_pem, mechs=None)
    try:
        answer = await put_token(client, f"{HOST}/devices/dev1", sas_token(DEV, DEVICE_KEY))
        assert answer.properties["status-code"] == 200
        assert answer.correlation_id == "req-1"
        sender = await client.sender(EVENTS)
        await client.send(sender, AmqpMessage(body=b'{"t": 1}', id="m-1"))
    finally:
        await client.close()
    [(identity, message)] = hub.stored
    assert identity == DEV
    assert message.body == b'{"t": 1}'
    assert message.system_properties["connectionAuthMethod"] == "sas"


async def test_a_module_without_sasl_logs_in_over_plain_tcp(head: AmqpServer, hub: InMemoryHub) -> None:
    client = await ProtonClient.connect(head.ports["amqp"], mechs=None)
    try:
        answer = await put_token(client, f"{HOST}/devices/dev1/modules/filter", sas_token(MOD, MODULE_KEY))
        assert answer.properties["status-code"] == 200
        sender = await client.sender("/devices/dev1/modules/filter/messages/events")
        await client.send(sender, AmqpMessage(body=b"out"))
    finally:
        await client.close()
    assert [(i, m.body) for i, m in hub.stored] == [(MOD, b"out")]


async def test_a_link_attached_before_a_token_is_refused_with_unauthorized_access_and_nothing_is_stored(
    head: AmqpServer, hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    client = await EngineClient.connect(head.ports["amqp"], None, None, mechs=None)
    try:
        for address in (EVENTS, "/devices/dev1/twin", "/devices/dev1/methods/devicebound"):
            link = client.sender(address, f"early {address}")
            await client.pump_until(lambda link=link: bool(link.state & Endpoint.REMOTE_CLOSED))  # type: ignore[misc]
            assert link.remote_condition is not None
            assert link.remote_condition.name == "amqp:unauthorized-access"
            assert link.remote_target.address is None  # refused: the attach came back with no terminus
    finally:
        await client.close()
    assert hub.stored == []
    lines = [r.getMessage() for r in caplog.records if r.name == LOG and r.getMessage().startswith("refused ")]
    assert len(lines) == 3
    assert all("reason=not_authorized" in line for line in lines)


async def test_a_bad_token_is_answered_401_and_the_client_is_still_not_let_in(
    head: AmqpServer, hub: InMemoryHub
) -> None:
    client = await ProtonClient.connect(head.ports["amqp"], mechs=None)
    try:
        answer = await put_token(client, f"{HOST}/devices/dev1", sas_token(DEV, MODULE_KEY))
        assert answer.properties["status-code"] == 401
        assert hub.connects == []
    finally:
        await client.close()


@pytest.fixture
async def impatient(hub: InMemoryHub) -> AsyncIterator[AmqpServer]:
    settings = AmqpSettings(tcp_port=0, tls_port=None, connect_timeout_s=0.5)
    async with AmqpServer(hub, settings=settings) as server:
        yield server


async def test_a_client_without_sasl_that_never_sends_a_token_is_closed_at_the_login_timeout(
    impatient: AmqpServer, hub: InMemoryHub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    client = await EngineClient.connect(impatient.ports["amqp"], None, None, mechs=None)
    try:
        client.sender("$cbs", "cbs")  # the token's link, and never a token
        async with asyncio.timeout(TIMEOUT_S):
            await client.pump_until(lambda: bool(client.connection.state & Endpoint.REMOTE_CLOSED))
        condition = client.connection.remote_condition
    finally:
        await client.close()
    assert condition is not None
    assert condition.name == "amqp:unauthorized-access"
    assert hub.connects == []
    lines = [r.getMessage() for r in caplog.records if r.name == LOG and r.getMessage().startswith("refused ")]
    assert len(lines) == 1
    assert "reason=connect_timeout" in lines[0]


def _received(link: Any) -> list[AmqpMessage]:
    """The whole messages proton's engine holds on receiving ``link``, read and settled."""
    out = []
    while (delivery := link.current) is not None and delivery.readable and not delivery.partial:
        message = AmqpMessage()
        message.decode(link.recv(delivery.pending))
        delivery.settle()
        link.advance()
        out.append(message)
    return out


async def test_a_cbs_answer_made_before_the_client_gave_credit_goes_once_it_does(
    head: AmqpServer, hub: InMemoryHub
) -> None:
    # The Node SDK attaches its $cbs links, sends its put-token and only then flows credit to the hub's $cbs link:
    # an answer made before that waits for it (it was dropped, and the SDK never logged in).
    client = await EngineClient.connect(head.ports["amqp"], None, None, mechs=None)
    try:
        answers = client.session.receiver("cbs-in")
        answers.source.address = "$cbs"
        answers.open()  # no credit yet
        requests = client.sender("$cbs", "cbs-out")
        await client.pump_until(lambda: requests.credit > 0)
        request = AmqpMessage(body=sas_token(DEV, DEVICE_KEY), id="tok-1", reply_to="cbs")
        request.properties = {
            "operation": "put-token",
            "type": "servicebus.windows.net:sastoken",
            "name": f"{HOST}/devices/dev1",
        }
        requests.delivery("t1")
        requests.send(request.encode())
        requests.advance()
        await client.pump_until(lambda: len(hub.connects) == 1)  # the token was checked: the answer is made
        assert _received(answers) == []
        answers.flow(1)
        got: list[AmqpMessage] = []

        def arrived() -> bool:
            got.extend(_received(answers))
            return bool(got)

        await client.pump_until(arrived)
    finally:
        await client.close()
    [answer] = got
    assert answer.correlation_id == "tok-1"
    assert answer.properties["status-code"] == 200
