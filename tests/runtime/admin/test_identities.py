"""Identities through the admin API of a running hub (in process): the real ``EdgeHub`` over RocksDB in tmp_path,
the MQTT head on 127.0.0.1, the admin API on port 0, paho clients."""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from edgehub.core import Identity
from edgehub.hub.facade import EdgeHub
from edgehub.routing import Router
from edgehub.runtime.admin.client import AdminClient, identity_path
from edgehub.runtime.admin.files import read_port, read_token
from edgehub.runtime.admin.server import serve_admin
from edgehub.runtime.cli.identity import thumbprint_of
from edgehub.store.rocks import open_rocks_store
from edgehub.testing.certs import TestCA
from protocol_heads.mqtt.server import MqttServer, MqttSettings
from tests.e2e.conftest import DEV, HOST, IN1, Rig, running_hub, sas, username
from tests.protocol_heads.mqtt.conftest import Paho

ROUTES = {"devices": f"FROM /messages/* INTO BrokeredEndpoint('{IN1}')"}
NEW = Identity.parse("newdev")


@dataclass
class Admin:
    rig: Rig
    client: AdminClient

    async def call(self, method: str, path: str, body: object | None = None) -> tuple[int, object]:
        return await asyncio.to_thread(self.client.request, method, path, body, ok=tuple(range(200, 600)))


@asynccontextmanager
async def hub_with_admin(tmp_path: Path) -> AsyncIterator[Admin]:
    async with (
        running_hub(tmp_path, routes=ROUTES) as rig,
        serve_admin(tmp_path, port=0, hub=rig.hub, server=rig.server),
    ):
        port, token = read_port(tmp_path), read_token(tmp_path)
        assert port is not None
        assert token is not None
        yield Admin(rig, AdminClient(port, token, timeout_s=10.0))
    assert read_port(tmp_path) is None  # the port file goes with the API


async def connected(port: int, identity: Identity, password: str, *, v5: bool = False) -> tuple[Paho, object]:
    protocol = MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311
    client = Paho.make(identity.id, protocol=protocol)
    rc = await client.connect(port, user=username(identity), password=password)
    return client, rc


async def test_an_identity_added_through_the_api_logs_in_at_once(tmp_path: Path) -> None:
    async with hub_with_admin(tmp_path) as admin:
        status, answer = await admin.call("POST", "/identities", {"id": NEW.id})
        assert status == 200
        assert isinstance(answer, dict)
        key = answer["key"]
        assert isinstance(key, str)
        client, rc = await connected(admin.rig.tcp, NEW, sas(NEW, key))
        try:
            assert not getattr(rc, "is_failure", True)
        finally:
            await client.close()


async def test_a_password_identity_added_through_the_api_logs_in_with_it(tmp_path: Path) -> None:
    async with hub_with_admin(tmp_path) as admin:
        status, _ = await admin.call("POST", "/identities", {"id": NEW.id, "auth": "password", "password": "s3cret"})
        assert status == 200
        good, rc = await connected(admin.rig.tcp, NEW, "s3cret")
        await good.close()
        bad, rc_bad = await connected(admin.rig.tcp, NEW, "wrong")
        await bad.close()
    assert not getattr(rc, "is_failure", True)
    assert getattr(rc_bad, "is_failure", False)


async def test_removing_an_identity_disconnects_it_at_once_and_keeps_its_queued_messages(tmp_path: Path) -> None:
    async with hub_with_admin(tmp_path) as admin:
        client, _ = await connected(admin.rig.tcp, DEV, sas(DEV), v5=True)
        try:
            for i in range(3):
                client.publish("devices/dev1/messages/events/", f"m{i}".encode())
            async with asyncio.timeout(10):
                for _ in range(3):
                    await client.publishes.get()
            queued = admin.rig.store.usage(IN1)
            assert queued[0] == 3
            status, answer = await admin.call("DELETE", identity_path(DEV.id))
            assert status == 200
            assert answer == {"id": DEV.id, "removed": True, "closed": 1}
            async with asyncio.timeout(1.0):  # issue 17: disconnected within a second
                reason = await client.disconnects.get()
            assert getattr(reason, "value", None) == 0x98  # MQTT 5: administrative action
        finally:
            await client.close()
        assert admin.rig.store.usage(IN1) == queued
        again, rc = await connected(admin.rig.tcp, DEV, sas(DEV))
        await again.close()
        assert getattr(rc, "is_failure", False)
        status, _ = await admin.call("DELETE", identity_path(DEV.id))
        assert status == 404


async def test_rotating_a_key_disconnects_and_only_the_new_key_logs_in(tmp_path: Path) -> None:
    async with hub_with_admin(tmp_path) as admin:
        client, _ = await connected(admin.rig.tcp, DEV, sas(DEV))
        try:
            status, answer = await admin.call("POST", identity_path(DEV.id) + "/rotate-key")
            assert status == 200
            assert isinstance(answer, dict)
            assert answer["closed"] == 1
            async with asyncio.timeout(1.0):
                await client.disconnects.get()
        finally:
            await client.close()
        old, rc_old = await connected(admin.rig.tcp, DEV, sas(DEV))
        await old.close()
        new, rc_new = await connected(admin.rig.tcp, DEV, sas(DEV, str(answer["key"])))
        await new.close()
    assert getattr(rc_old, "is_failure", False)
    assert not getattr(rc_new, "is_failure", True)


async def test_the_list_names_each_way_to_log_in_and_no_secret(tmp_path: Path) -> None:
    thumb = "ab" * 32
    async with hub_with_admin(tmp_path) as admin:
        await admin.call("POST", "/identities", {"id": "cam", "auth": "x509", "thumbprint": thumb})
        await admin.call("POST", "/identities", {"id": "cam", "auth": "x509-ca"})
        await admin.call("POST", "/identities", {"id": "edge/mod", "auth": "password", "password": "pw-123"})
        status, answer = await admin.call("GET", "/identities")
    assert status == 200
    assert isinstance(answer, dict)
    listed = {e["id"]: e["auth"] for e in answer["identities"]}
    assert listed["cam"] == ["x509", "x509-ca"]
    assert listed["edge/mod"] == ["password"]
    assert listed[DEV.id] == ["sas"]
    text = json.dumps(answer)
    assert thumb not in text
    assert "pw-123" not in text
    assert "scrypt" not in text


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"id": "x", "auth": "kerberos"}, "auth: one of"),
        ({"id": "x", "auth": "x509"}, "thumbprint: needed"),
        ({"id": "x", "auth": "x509", "thumbprint": "zz"}, "64 hex digits"),
        ({"id": "x", "key": "not base64!"}, "key: not base64"),
        ({"id": "x", "key": "c2hvcnQ="}, "16 to 64 bytes"),
        ({"id": "x", "auth": "password"}, "password: needed"),
        ({"id": "x", "password": "p"}, "password: not taken with auth sas"),
        ({"id": "bad id with spaces"}, "id:"),
        ({"id": "x", "colour": "red"}, "colour: unknown field"),
        ({"id": 5}, "id: must be a string"),
        ({}, "id: missing"),
    ],
)
async def test_an_add_with_a_bad_field_is_refused_400_naming_it(
    tmp_path: Path, body: dict[str, object], why: str
) -> None:
    async with hub_with_admin(tmp_path) as admin:
        status, answer = await admin.call("POST", "/identities", body)
        assert status == 400
        assert isinstance(answer, dict)
        assert why in str(answer["detail"])
        assert [i.id for i, _ in admin.rig.hub.identities.identities()] == ["dev1", "edge/filter", "edge/sensor"]


async def test_rotating_an_identity_without_a_key_is_refused(tmp_path: Path) -> None:
    async with hub_with_admin(tmp_path) as admin:
        await admin.call("POST", "/identities", {"id": "cam", "auth": "x509-ca"})
        status, answer = await admin.call("POST", "/identities/cam/rotate-key")
        missing, _ = await admin.call("POST", "/identities/nobody/rotate-key")
        other, _ = await admin.call("POST", "/identities/cam/refresh")
    assert status == 400
    assert "no symmetric key" in str(answer)
    assert (missing, other) == (404, 404)


@asynccontextmanager
async def tls_hub_with_admin(tmp_path: Path) -> AsyncIterator[tuple[AdminClient, MqttServer, TestCA]]:
    """A hub whose TLS listener asks for client certificates and checks them against a test CA."""
    ca = TestCA(tmp_path / "certs")
    pair = ca.server()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pair.cert, pair.key)
    ctx.load_verify_locations(ca.ca_pem)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    store = open_rocks_store(tmp_path / "store")
    try:
        async with (
            EdgeHub(store=store, router=Router(ROUTES), host_name=HOST) as hub,
            MqttServer(hub, settings=MqttSettings(tls_port=0, ssl_context=ctx, connect_timeout_s=5.0)) as server,
            serve_admin(tmp_path, port=0, hub=hub, server=server),
        ):
            port, token = read_port(tmp_path), read_token(tmp_path)
            assert port is not None
            assert token is not None
            yield AdminClient(port, token, timeout_s=10.0), server, ca
    finally:
        await store.close()


async def cert_login(server: MqttServer, ca: TestCA, cert: Path, key: Path, *, as_identity: str) -> object:
    client = Paho.make(as_identity)
    client.client.tls_set(ca_certs=str(ca.ca_pem), certfile=str(cert), keyfile=str(key))
    try:
        return await client.connect(server.ports["tls"], user=f"{HOST}/{as_identity}/?api-version=2021-04-12")
    finally:
        await client.close()


async def test_x509_identities_added_through_the_api_log_in_with_their_certificates(tmp_path: Path) -> None:
    async with tls_hub_with_admin(tmp_path) as (client, server, ca):
        cam1, cam2, other = ca.client("cam1"), ca.client("cam2"), ca.client("someone-else")
        thumbprint = thumbprint_of(cam1.cert)  # as `identity add --cert-file` computes it
        for body in ({"id": "cam1", "auth": "x509", "thumbprint": thumbprint}, {"id": "cam2", "auth": "x509-ca"}):
            status, _ = await asyncio.to_thread(client.request, "POST", "/identities", body)
            assert status == 200
        by_thumbprint = await cert_login(server, ca, cam1.cert, cam1.key, as_identity="cam1")
        ca_signed = await cert_login(server, ca, cam2.cert, cam2.key, as_identity="cam2")
        wrong_cn = await cert_login(server, ca, other.cert, other.key, as_identity="cam2")
    assert not getattr(by_thumbprint, "is_failure", True)
    assert not getattr(ca_signed, "is_failure", True)
    assert getattr(wrong_cn, "is_failure", False)


def post_bytes(client: AdminClient, path: str, body: bytes) -> tuple[int, bytes]:
    """POST a body as given: json.dumps cannot even write the integers the hub must refuse."""
    conn = http.client.HTTPConnection(client.host, client.port, timeout=client.timeout_s)
    try:
        conn.request("POST", path, body=body, headers={"Authorization": f"Bearer {client.token}"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


async def test_adding_an_identity_with_a_5000_digit_integer_is_a_400_and_adds_nothing(tmp_path: Path) -> None:
    body = b'{"id": "' + NEW.id.encode() + b'", "key": ' + b"9" * 5000 + b"}"
    async with hub_with_admin(tmp_path) as admin:
        status, raw = await asyncio.to_thread(post_bytes, admin.client, "/identities", body)
        _, listed = await admin.call("GET", "/identities")
    assert status == 400
    answer = json.loads(raw)
    assert answer["error"] == "invalid_request"
    assert "an integer of 5000 digits" in answer["detail"]
    assert isinstance(listed, dict)
    assert NEW.id not in [i["id"] for i in listed["identities"]]
