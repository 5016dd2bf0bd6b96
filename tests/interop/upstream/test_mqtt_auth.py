"""The MQTT upstream authenticates the ways brokers ask: username/password, TLS with a client certificate."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from edgehub.core import Message
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.testing.peers import MosquittoPeer, PeerWay
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, TlsSettings
from edgehub.upstream.mqtt.transport import MqttUpstream

_BATCH = [QueuedMessage(message=Message(body=b"x"), offset=0, priority=0, enqueued_at_s=1.7e9, ttl_s=60)]


def _settings(port: int, **kw: object) -> MqttUpstreamSettings:
    base: dict[str, object] = {
        "host": "127.0.0.1",
        "port": port,
        "client_id": "hub1",
        "hub_id": "hub1",
        "connect_timeout_s": 3.0,
        "reconnect_min_s": 0.1,
        "reconnect_max_s": 0.3,
    }
    base.update(kw)
    return MqttUpstreamSettings(**base)  # type: ignore[arg-type]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_pki(d: Path) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    signed_by_ca = ["-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-extfile", "san.ext"]
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-out", f"{name}.crt", *signed_by_ca, cwd=d)


async def test_username_and_password_are_required_and_accepted(tmp_path: Path) -> None:
    pw = tmp_path / "passwd"
    cmd = ["mosquitto_passwd", "-b", "-c", str(pw), "edge", "s3cret"]
    await asyncio.to_thread(subprocess.run, cmd, check=True, capture_output=True)
    pw.chmod(0o600)
    async with (
        asyncio.timeout(30),
        MosquittoPeer(
            tmp_path, way=PeerWay.BINARY, allow_anonymous=False, extra_config=[f"password_file {pw}"]
        ) as broker,
    ):
        wrong = MqttUpstream(_settings(broker.port, username="edge", password="nope"))
        async with wrong:
            connected = asyncio.create_task(wrong.wait_connected())
            done, _ = await asyncio.wait({connected}, timeout=1.0)
            assert not done  # refused, and still retrying
            connected.cancel()
        async with MqttUpstream(_settings(broker.port, username="edge", password="s3cret")) as right:
            await right.wait_connected()
            assert (await right.send(_BATCH)).succeeded


async def test_tls_with_a_client_certificate_connects_and_delivers(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    pki.mkdir()
    await asyncio.to_thread(_make_pki, pki)
    conf = [
        f"cafile {pki / 'ca.crt'}",
        f"certfile {pki / 'server.crt'}",
        f"keyfile {pki / 'server.key'}",
        "require_certificate true",
    ]
    # The broker's readiness probe speaks plain MQTT, which a TLS listener cannot answer: a plain listener
    # on another port stays for the probe, and the TLS listener is the one under test.
    async with asyncio.timeout(30):
        from edgehub.testing.peers import free_port

        tls_port = free_port()
        async with MosquittoPeer(
            tmp_path, way=PeerWay.BINARY, extra_config=[f"listener {tls_port} 127.0.0.1", *conf]
        ) as broker:
            assert broker.port != tls_port
            tls = TlsSettings(
                ca_certs=str(pki / "ca.crt"), certfile=str(pki / "client.crt"), keyfile=str(pki / "client.key")
            )
            async with MqttUpstream(_settings(tls_port, tls=tls)) as up:
                await up.wait_connected()
                assert (await up.send(_BATCH)).succeeded
