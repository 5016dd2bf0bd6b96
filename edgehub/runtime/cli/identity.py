"""``edgehub identity add|list|remove|rotate-key``: the identities devices and modules log in with, managed the
same way whether the hub runs or not.

While a hub runs on ``--data-dir`` (its ``admin.port`` names a port where it answers), each command goes through
its admin API (``edgehub.runtime.admin.identities``): the change takes effect at once, and ``remove`` and
``rotate-key`` close the identity's live connections. Otherwise the command opens the store itself and runs the
same operations on it (RocksDB's lock keeps a hub and the command from holding the store together: if a hub
holds it but its admin API does not answer, the command says so and exits 1).

``add`` prints an IoT Hub style connection string for ``sas`` (with ``GatewayHostName``, so SDK clients dial this
hub); ``x509`` takes ``--thumbprint`` or ``--cert-file`` (its SHA-256 is computed here); ``password`` reads the
password from ``$EDGEHUB_IDENTITY_PASSWORD`` or asks for it (never from the command line, where others see it).
``--parent GW``: the device sits behind the device ``GW`` (a child hub logged in as ``GW``), which may then take its
cloud-to-device messages and method calls (``protocol_heads.mqtt.children``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

from edgehub.core import DeviceId, Identity, ModuleId, StoreError
from edgehub.core.sas import ConnectionString
from edgehub.runtime.admin.client import AdminClient, AdminError, identity_path, running_hub
from edgehub.runtime.admin.identities import AUTH_KINDS, IdentityAdmin, IdentityError, IdentitySpec
from edgehub.runtime.compose.config import DEFAULT_HOST_NAME
from edgehub.runtime.compose.store import open_identities, open_store, seal_clear_identity_keys

__all__ = ["identity", "on_hub"]

T = TypeVar("T")
_MAX_CERT_BYTES = 1 << 20

data_dir_option = click.option(
    "--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data"), show_default=True
)
module_option = click.option("--module", "module", default=None, help="Module id: a module identity of DEVICE.")


@click.group()
def identity() -> None:
    """Manage the identities devices and modules log in with (the hub may be running)."""


def on_hub(
    data_dir: Path,
    online: Callable[[AdminClient], T],
    offline: Callable[[Path], Coroutine[Any, Any, T]],
) -> T:
    """``online`` through the running hub's admin API, else ``offline`` on the data directory; refusals and a
    store held by a hub that does not answer become a message and exit status 1."""
    client = running_hub(data_dir)
    try:
        if client is not None:
            return online(client)
        return asyncio.run(offline(data_dir))
    except AdminError as exc:
        click.echo(f"edgehub: {exc}", err=True)
        raise SystemExit(1) from None
    except IdentityError as exc:
        click.echo(f"edgehub: {exc}", err=True)
        raise SystemExit(1) from None
    except StoreError as exc:
        click.echo(
            f"edgehub: cannot open the store in {data_dir}, and no hub answers on its admin API "
            f"(is a hub running there with --admin-port off, or still starting?): {exc}",
            err=True,
        )
        raise SystemExit(1) from None


async def _offline(data_dir: Path, host_name: str, act: Callable[[IdentityAdmin], Awaitable[T]]) -> T:
    store = open_store(data_dir)
    try:
        registry = open_identities(store, host_name, data_dir=data_dir)
        await seal_clear_identity_keys(registry)
        return await act(IdentityAdmin(registry))
    finally:
        await store.close()


def _identity(device: str, module: str | None) -> Identity:
    try:
        return Identity(DeviceId(device), ModuleId(module) if module else None)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _connection_string(ident: Identity, key: str, host_name: str) -> str:
    return ConnectionString(
        host_name=host_name,
        device_id=ident.device_id,
        module_id=ident.module_id,
        shared_access_key=key,
        gateway_host_name=host_name,
    ).format()


def thumbprint_of(cert_file: Path) -> str:
    """The SHA-256 thumbprint (hex) of the first certificate in a PEM or DER file, as the MQTT head computes it."""
    from cryptography import x509  # only here: the other commands need not load it
    from cryptography.hazmat.primitives.serialization import Encoding

    raw = cert_file.read_bytes()[: _MAX_CERT_BYTES + 1]
    if len(raw) > _MAX_CERT_BYTES:
        raise click.BadParameter("not a certificate (over 1 MiB)", param_hint="--cert-file")
    try:
        cert = x509.load_pem_x509_certificate(raw) if b"-----BEGIN" in raw else x509.load_der_x509_certificate(raw)
    except ValueError as exc:
        raise click.BadParameter(f"not a certificate: {exc}", param_hint="--cert-file") from None
    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()


@identity.command("add")
@click.argument("device")
@module_option
@click.option("--auth", type=click.Choice(AUTH_KINDS), default="sas", show_default=True, help="How it logs in.")
@click.option("--key", default=None, help="sas: this base64 key instead of a fresh one.")
@click.option("--thumbprint", default=None, help="x509: the certificate's SHA-256 thumbprint (64 hex digits).")
@click.option(
    "--cert-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="x509: the device's certificate (PEM or DER); its thumbprint is taken.",
)
@data_dir_option
@click.option("--host-name", default=DEFAULT_HOST_NAME, show_default=True, help="HostName and GatewayHostName.")
@click.option("--parent", default=None, help="The device (a child hub) this device sits behind.")
def add(
    device: str,
    module: str | None,
    auth: str,
    key: str | None,
    thumbprint: str | None,
    cert_file: Path | None,
    data_dir: Path,
    host_name: str,
    parent: str | None,
) -> None:
    """Add an identity (or another way for it to log in); for sas, print its connection string."""
    ident = _identity(device, module)
    gateway = _identity(parent, None) if parent else None
    if cert_file is not None:
        if thumbprint is not None:
            raise click.UsageError("--thumbprint or --cert-file, not both")
        thumbprint = thumbprint_of(cert_file)
    password = None
    if auth == "password":
        password = os.environ.get("EDGEHUB_IDENTITY_PASSWORD") or click.prompt(
            "password", hide_input=True, confirmation_prompt=True, type=str
        )
    try:
        spec = IdentitySpec(ident, auth, key, thumbprint, password, gateway).checked()
    except IdentityError as exc:
        raise click.UsageError(str(exc)) from None

    def online(client: AdminClient) -> str | None:
        body = {
            "id": ident.id,
            "auth": auth,
            "key": key,
            "thumbprint": thumbprint,
            "password": password,
            "parent": parent,
        }
        _, answer = client.request("POST", "/identities", {k: v for k, v in body.items() if v is not None})
        new_key = answer.get("key") if isinstance(answer, dict) else None
        return str(new_key) if new_key is not None else None

    async def offline(path: Path) -> str | None:
        return await _offline(path, host_name, lambda admin: admin.add(spec))

    new_key = on_hub(data_dir, online, offline)
    if new_key is not None:
        click.echo(_connection_string(ident, new_key, host_name))
    else:
        click.echo(f"added {ident.id} ({auth})")


@identity.command("list")
@data_dir_option
@click.option("--json", "as_json", is_flag=True, default=False, help="One JSON document.")
def list_identities(data_dir: Path, as_json: bool) -> None:
    """List the identities and how each logs in (no secrets)."""

    def online(client: AdminClient) -> list[dict[str, object]]:
        _, answer = client.request("GET", "/identities")
        assert isinstance(answer, dict)
        listed = answer["identities"]
        assert isinstance(listed, list)
        return listed

    async def offline(path: Path) -> list[dict[str, object]]:
        async def act(admin: IdentityAdmin) -> list[dict[str, object]]:
            return admin.list()

        return await _offline(path, DEFAULT_HOST_NAME, act)

    listed = on_hub(data_dir, online, offline)
    if as_json:
        click.echo(json.dumps({"identities": listed}, indent=2))
        return
    for entry in listed:
        ways = entry.get("auth")
        click.echo(f"{entry['id']}\t{','.join(ways) if isinstance(ways, list) else ways}")


@identity.command("remove")
@click.argument("device")
@module_option
@data_dir_option
def remove(device: str, module: str | None, data_dir: Path) -> None:
    """Remove an identity; a running hub closes its connections at once (its queued messages stay)."""
    ident = _identity(device, module)

    def online(client: AdminClient) -> tuple[bool, int]:
        status, answer = client.request("DELETE", identity_path(ident.id), ok=(200, 404))
        closed = answer.get("closed", 0) if isinstance(answer, dict) else 0
        return status == 200, int(closed) if isinstance(closed, int) else 0

    async def offline(path: Path) -> tuple[bool, int]:
        return await _offline(path, DEFAULT_HOST_NAME, lambda admin: admin.remove(ident))

    existed, closed = on_hub(data_dir, online, offline)
    if not existed:
        click.echo(f"edgehub: no identity {ident.id}", err=True)
        raise SystemExit(1)
    click.echo(f"removed {ident.id}; connections closed: {closed}")


@identity.command("rotate-key")
@click.argument("device")
@module_option
@data_dir_option
@click.option("--host-name", default=DEFAULT_HOST_NAME, show_default=True, help="HostName and GatewayHostName.")
def rotate_key(device: str, module: str | None, data_dir: Path, host_name: str) -> None:
    """Give an identity a fresh symmetric key and print its connection string; a running hub closes the
    identity's connections at once (they log in again with the new key)."""
    ident = _identity(device, module)

    def online(client: AdminClient) -> str:
        _, answer = client.request("POST", identity_path(ident.id) + "/rotate-key")
        assert isinstance(answer, dict)
        return str(answer["key"])

    async def offline(path: Path) -> str:
        async def act(admin: IdentityAdmin) -> str:
            key, _ = await admin.rotate_key(ident)
            return key

        return await _offline(path, host_name, act)

    click.echo(_connection_string(ident, on_hub(data_dir, online, offline), host_name))
