"""SASL EXTERNAL refused: a client certificate the hub's CA signed but that names no identity it knows gets the
SASL outcome ``auth`` (refused as bad credentials, one refusal line), and one the hub does not trust fails the TLS
handshake (one ``tls_handshake_failed`` line); either way the hub lets go of the connection and its place under
the caps, also when the client hangs up as soon as it has its answer.

The client here is proton's engine under a test-driven asyncio socket with proton's TLS, so the test reads the SASL
outcome itself (proton's blocking client reports every failed outcome as the same ``unauthorized-access``)."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest
from proton import SASL, SSL, Connection, SSLDomain, Transport

from edgehub.testing.certs import TestCA
from protocol_heads.amqp import AmqpServer
from tests.protocol_heads.amqp.conftest import TIMEOUT_S, polled

pytestmark = pytest.mark.interop

LOG = "protocol_heads.amqp.server"
ATTEMPTS = 8  # the hang-up raced the hub's close: most runs of a hub without the fix left one of 8 behind


async def sasl_outcome(port: int, ca: Path, cert: tuple[Path, Path]) -> int | None:
    """Log in with SASL EXTERNAL and ``cert`` over TLS; the SASL outcome code (None: the connection ended first).
    Run in a thread on a blocking socket, as a device's client runs beside the hub: the socket is closed the
    moment the outcome is in, which can be before the hub has closed its side."""
    return await asyncio.to_thread(_sasl_outcome, port, ca, cert)


def _sasl_outcome(port: int, ca: Path, cert: tuple[Path, Path]) -> int | None:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
    domain.set_credentials(str(cert[0]), str(cert[1]), None)
    transport = Transport(Transport.CLIENT)
    SSL(transport, domain)
    sasl = transport.sasl()
    sasl.allowed_mechs("EXTERNAL")
    connection = Connection()
    connection.open()
    transport.bind(connection)
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        while sasl.outcome is None:
            pending = transport.pending()
            if pending > 0:
                sock.sendall(bytes(transport.peek(pending)))
                transport.pop(pending)
            data = sock.recv(65536)
            if not data:
                return None
            transport.push(data)
        return int(sasl.outcome)


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG and r.getMessage().startswith("refused ")]


async def test_sasl_external_naming_an_unknown_identity_gets_outcome_auth_and_is_let_go(
    head: AmqpServer, ca: TestCA, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    pair = ca.client("stranger")  # signed by the CA the hub trusts; no identity "stranger"
    for attempt in range(1, ATTEMPTS + 1):
        outcome = await sasl_outcome(head.ports["amqps"], ca.ca_pem, (pair.cert, pair.key))
        assert outcome == SASL.AUTH
        await polled(lambda: head.limiter.total == 0)  # the connection and its pre-login slot are given back
        assert head.refusals.total == attempt  # one refusal per connection
    # One line each, up to the RefusalLog's burst per peer (then held back and counted).
    lines = refusal_lines(caplog)
    assert len(lines) == min(ATTEMPTS, 5)
    assert all("reason=bad_credentials" in line and "client=stranger" in line for line in lines)
    assert head.connected == []
    assert head.limiter.closed == ATTEMPTS


async def test_a_client_certificate_the_hub_does_not_trust_fails_the_handshake_once(
    head: AmqpServer, ca: TestCA, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    other = TestCA(tmp_path / "other", name="a CA the hub does not know").client("dev1")
    outcome = await sasl_outcome(head.ports["amqps"], ca.ca_pem, (other.cert, other.key))
    assert outcome is None  # no SASL at all: the handshake failed
    await polled(lambda: head.limiter.total == 0)
    [line] = refusal_lines(caplog)
    assert "reason=tls_handshake_failed" in line
    assert head.connected == []
