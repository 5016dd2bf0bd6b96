"""``edgehub identity`` on a stopped hub's data directory (RocksDB in tmp_path, click's runner in process): every
way to log in, listing without secrets, and refusals with a reason and exit status."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from edgehub.core import Identity
from edgehub.core.sas import ConnectionString
from edgehub.runtime.cli import main
from edgehub.runtime.cli.identity import thumbprint_of
from edgehub.runtime.compose.store import open_identities, open_store
from edgehub.testing.certs import TestCA


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_each_way_to_log_in_is_added_and_listed_without_its_secret(tmp_path: Path) -> None:
    data = str(tmp_path)
    cert = TestCA(tmp_path / "ca").client("cam")
    code, out, _ = run("identity", "add", "dev1", "--data-dir", data)
    assert code == 0
    assert ConnectionString.parse(out.strip()).identity == Identity.parse("dev1")
    assert run("identity", "add", "cam", "--auth", "x509", "--cert-file", str(cert.cert), "--data-dir", data)[0] == 0
    assert run("identity", "add", "cam", "--auth", "x509-ca", "--data-dir", data)[0] == 0
    env = {"EDGEHUB_IDENTITY_PASSWORD": "pw-1234"}
    code, out, _ = run("identity", "add", "edge", "--module", "m", "--auth", "password", "--data-dir", data, env=env)
    assert (code, out.strip()) == (0, "added edge/m (password)")
    code, out, _ = run("identity", "list", "--data-dir", data)
    assert code == 0
    assert out.splitlines() == ["cam\tx509,x509-ca", "dev1\tsas", "edge/m\tpassword"]
    assert "pw-1234" not in out

    async def record_of_cam() -> str | None:
        store = open_store(tmp_path)
        try:
            record = open_identities(store, "localhost", data_dir=tmp_path).get(Identity.parse("cam"))
            return record.thumbprint if record is not None else None
        finally:
            await store.close()

    der = x509.load_pem_x509_certificate(cert.cert.read_bytes()).public_bytes(Encoding.DER)
    assert asyncio.run(record_of_cam()) == hashlib.sha256(der).hexdigest() == thumbprint_of(cert.cert)


def test_rotate_key_gives_a_new_key_and_refuses_an_identity_without_one(tmp_path: Path) -> None:
    data = str(tmp_path)
    first = ConnectionString.parse(run("identity", "add", "dev1", "--data-dir", data)[1].strip())
    code, out, _ = run("identity", "rotate-key", "dev1", "--data-dir", data)
    assert code == 0
    assert ConnectionString.parse(out.strip()).shared_access_key != first.shared_access_key
    run("identity", "add", "cam", "--auth", "x509-ca", "--data-dir", data)
    code, _, err = run("identity", "rotate-key", "cam", "--data-dir", data)
    assert code == 1
    assert "has no symmetric key" in err
    code, _, err = run("identity", "rotate-key", "nobody", "--data-dir", data)
    assert code == 1
    assert "no identity nobody" in err


def test_remove_deletes_the_identity_and_says_when_there_is_none(tmp_path: Path) -> None:
    data = str(tmp_path)
    run("identity", "add", "dev1", "--data-dir", data)
    code, out, _ = run("identity", "remove", "dev1", "--data-dir", data)
    assert (code, out.strip()) == (0, "removed dev1; connections closed: 0")
    assert run("identity", "list", "--data-dir", data)[1] == ""
    code, _, err = run("identity", "remove", "dev1", "--data-dir", data)
    assert code == 1
    assert "no identity dev1" in err


def test_bad_arguments_are_refused_with_the_reason(tmp_path: Path) -> None:
    data = str(tmp_path)
    code, _, err = run("identity", "add", "cam", "--auth", "x509", "--data-dir", data)
    assert code == 2
    assert "thumbprint: needed with auth x509" in err
    code, _, err = run("identity", "add", "cam", "--auth", "x509", "--thumbprint", "abc", "--data-dir", data)
    assert code == 2
    assert "64 hex digits" in err
    code, _, err = run("identity", "add", "dev one", "--data-dir", data)
    assert code == 2
    assert "not an IoT Hub id" in err
    not_a_cert = tmp_path / "x.pem"
    not_a_cert.write_bytes(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    code, _, err = run("identity", "add", "cam", "--auth", "x509", "--cert-file", str(not_a_cert), "--data-dir", data)
    assert code == 2
    assert "not a certificate" in err
