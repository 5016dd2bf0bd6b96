"""``edgehub identity add DEVICE [--module M] [--parent GW] --data-dir DIR``: make a symmetric-key identity in the
hub's store and print its IoT Hub style connection string (with ``GatewayHostName``, so SDK clients dial this hub).
``--parent GW``: the device sits behind the device ``GW`` (a child hub logged in as ``GW``), which may then take its
cloud-to-device messages and method calls (``protocol_heads.mqtt.children``).

The store is opened directly, so the hub must not be running on the same data directory (RocksDB takes a
lock; the command says so and exits 1 if it is)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from edgehub.core import DeviceId, Identity, ModuleId, StoreError
from edgehub.core.sas import ConnectionString
from edgehub.runtime.hub_runtime import DEFAULT_HOST_NAME, open_identities, open_store

__all__ = ["identity"]


@click.group()
def identity() -> None:
    """Manage the identities devices and modules log in with."""


async def _add(data_dir: Path, ident: Identity, host_name: str, parent: Identity | None) -> str:
    store = open_store(data_dir)
    try:
        registry = open_identities(store, host_name)
        key = await registry.add_symmetric_key(ident)
        if parent is not None:
            await registry.set_parent(ident, parent)
        return key
    finally:
        await store.close()


@identity.command("add")
@click.argument("device")
@click.option("--module", "module", default=None, help="Module id: make a module identity of DEVICE.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data"), show_default=True)
@click.option("--host-name", default=DEFAULT_HOST_NAME, show_default=True, help="HostName and GatewayHostName.")
@click.option("--parent", default=None, help="The device (a child hub) this device sits behind.")
def add(device: str, module: str | None, data_dir: Path, host_name: str, parent: str | None) -> None:
    """Create (or re-key) a symmetric-key identity and print its connection string."""
    try:
        ident = Identity(DeviceId(device), ModuleId(module) if module else None)
        gateway = Identity(DeviceId(parent)) if parent else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if gateway is not None and (module or gateway == ident):
        raise click.BadParameter("--parent is for a device, and names another device")
    try:
        key = asyncio.run(_add(data_dir, ident, host_name, gateway))
    except StoreError as exc:
        click.echo(f"cannot open the store in {data_dir} (is the hub running on it?): {exc}", err=True)
        raise SystemExit(1) from None
    cs = ConnectionString(
        host_name=host_name,
        device_id=ident.device_id,
        module_id=ident.module_id,
        shared_access_key=key,
        gateway_host_name=host_name,
    )
    click.echo(cs.format())
