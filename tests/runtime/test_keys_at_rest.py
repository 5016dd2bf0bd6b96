"""Keys at rest (issue 34, item 5): a real data directory in tmp_path, written by ``edgehub identity`` (click's
runner, in process) and read back byte for byte (its modes: test_data_dir.py). No symmetric key is in any file
of the store, neither as given (base64) nor as its raw bytes; a store an older hub
wrote with keys in clear is sealed when opened, and its keys still log in."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import stat
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgehub.core import ConfigurationError, Identity, SystemClock
from edgehub.core.sas import ConnectionString, generate_sas_token, resource_uri
from edgehub.hub import Credentials
from edgehub.hub.identities import IdentityRegistry
from edgehub.runtime.cli import main
from edgehub.runtime.compose.store import open_identities, open_store, store_path
from edgehub.runtime.keyseal import SEAL_KEY_FILE, ensure_sealer

HOST = "localhost"
DEV = Identity.parse("dev1")


def edgehub(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def files_holding(directory: Path, needles: list[bytes]) -> list[str]:
    """The files under ``directory`` whose bytes hold any of ``needles``."""
    return [
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and any(n in p.read_bytes() for n in needles)
    ]


def key_forms(key_b64: str) -> list[bytes]:
    return [key_b64.encode(), base64.b64decode(key_b64)]


async def logs_in(data: Path, identity: Identity, key_b64: str) -> bool:
    store = open_store(data)
    try:
        registry = open_identities(store, HOST, data_dir=data)
        token = generate_sas_token(resource_uri(HOST, identity), key_b64, int(time.time()) + 3600)
        result = await registry.authenticate(Credentials(identity, password=token.encode()))
        return result.identity == identity
    finally:
        await store.close()


def test_identity_add_leaves_a_private_data_dir_with_no_key_in_any_store_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    key = ConnectionString.parse(edgehub("identity", "add", DEV.id, "--data-dir", str(data)).strip())
    assert key.shared_access_key is not None
    edgehub("identity", "add", "dev2", "--data-dir", str(data))
    assert stat.S_IMODE((data / SEAL_KEY_FILE).stat().st_mode) == 0o600
    assert any(p.suffix == ".sst" for p in store_path(data).iterdir())  # the record reached a table, not only the WAL
    assert files_holding(store_path(data), key_forms(key.shared_access_key)) == []
    assert asyncio.run(logs_in(data, DEV, key.shared_access_key))


def test_a_store_with_keys_in_clear_is_sealed_when_opened_and_its_keys_still_log_in(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"

    async def as_an_older_hub_wrote_it() -> str:
        store = open_store(data)
        try:
            return await IdentityRegistry(store, host_name=HOST, clock=SystemClock()).add_symmetric_key(DEV)
        finally:
            await store.close()

    key = asyncio.run(as_an_older_hub_wrote_it())
    assert files_holding(store_path(data), key_forms(key)) != []  # what the issue found: the key in clear
    caplog.set_level(logging.INFO)
    assert edgehub("identity", "list", "--data-dir", str(data)).split() == [DEV.id, "sas"]
    assert [r.getMessage() for r in caplog.records if "identity.keys_sealed" in r.getMessage()] == [
        "identity.keys_sealed count=1 why=kept_in_clear_by_an_older_hub"
    ]
    assert files_holding(store_path(data), key_forms(key)) == []
    assert asyncio.run(logs_in(data, DEV, key))
    caplog.clear()
    edgehub("identity", "list", "--data-dir", str(data))  # sealed once: the next open has nothing to do
    assert not [r for r in caplog.records if "identity.keys_sealed" in r.getMessage()]


def test_the_seal_key_file_is_0600_kept_across_opens_and_a_damaged_one_stops_the_start(tmp_path: Path) -> None:
    sealed = ensure_sealer(tmp_path).seal(b"secret", bound_to=DEV.id)
    path = tmp_path / SEAL_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o644)
    assert ensure_sealer(tmp_path).unseal(sealed, bound_to=DEV.id) == b"secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("not a key\n")
    with pytest.raises(ConfigurationError, match="seal key"):
        ensure_sealer(tmp_path)
