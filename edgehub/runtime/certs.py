"""The hub's own TLS material: on first start, a CA and a server certificate under ``DIR/certs/``.

Files: ``ca.pem`` (the certificate clients trust), ``ca.key`` (kept to issue more later), ``server.pem`` and
``server.key`` (SAN: localhost, 127.0.0.1 and the extra names given). Keys are EC P-256, written 0600.
Invariant: a complete set is never replaced (a restart keeps the CA clients already trust); an incomplete one
is made again whole.

cryptography is imported only when a set is made (the first start): loading it costs ~14 MB of RSS and ~0.4 s
of start-up on a Pi-class board, and every later start only reads the files (``ssl`` does that).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["HubCerts", "ensure_certs", "server_ssl_context"]

_CA_YEARS = 10
_SERVER_DAYS = 825


@dataclass(frozen=True, slots=True)
class HubCerts:
    ca_pem: Path
    server_pem: Path
    server_key: Path
    created: bool  # made now (first start), not found


def _name(cn: str) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def ensure_certs(directory: Path, *, extra_names: tuple[str, ...] = ()) -> HubCerts:
    """The CA and server certificate in ``directory``, created if ``ca.pem`` or ``server.pem`` is missing."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_pem, ca_key = directory / "ca.pem", directory / "ca.key"
    server_pem, server_key = directory / "server.pem", directory / "server.key"
    if ca_pem.exists() and server_pem.exists() and server_key.exists():
        return HubCerts(ca_pem, server_pem, server_key, created=False)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("edgehub CA"))
        .issuer_name(_name("edgehub CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365 * _CA_YEARS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    san: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    san += [x509.DNSName(n) for n in extra_names if n not in ("localhost", "127.0.0.1")]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=_SERVER_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(ca_key, key)
    _write_key(server_key, leaf_key)
    server_pem.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))  # last: its presence means "all made"
    return HubCerts(ca_pem, server_pem, server_key, created=True)


def server_ssl_context(certs: HubCerts) -> ssl.SSLContext:
    """TLS for the listener; client certificates are asked for (optional) and checked against our CA."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.server_pem, certs.server_key)
    ctx.load_verify_locations(certs.ca_pem)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx
