"""Identities and their secrets, kept in the store's metadata area (key ``identity/{deviceId}[/{moduleId}]``).

An identity record may hold any of: a symmetric key (base64, for SAS tokens), a password hash (scrypt, salted,
stdlib ``hashlib.scrypt``), an X.509 thumbprint (SHA-256 hex of the DER certificate), and ``x509_ca`` (a client
certificate that chained to the listener's CAs and names the identity as its CN is accepted).

Invariants: a plain password is never stored, only its scrypt hash; a symmetric key is stored sealed
(``key_sealed``, by the registry's ``SecretSealer``, bound to the identity) whenever the registry has a sealer, so
a copied store, or a backup of it, holds no key in clear (without a sealer, as in tests of the hub alone, it is kept as
given); a record kept by an older hub with its key in clear still works and is sealed by ``seal_clear_keys``,
which the runtime runs at start; every comparison of a secret is constant time (``hmac.compare_digest``); a
record is written durably before ``add``/``set`` return. ``authenticate``
raises ``AuthenticationError`` and nothing else for whatever a client presents (password, user name, certificate
fields); a SAS token may live at most ``max_token_lifetime_s`` (default a year) from the time it is presented.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import asdict, dataclass, replace

from edgehub.core import AuthenticationError, Clock, Identity, SealedSecretError
from edgehub.core.sas import DEFAULT_MAX_TOKEN_LIFETIME_S, resource_uri, verify_sas_token
from edgehub.core.sealing import SecretSealer
from edgehub.hub import AuthResult, Credentials
from edgehub.store import Store

__all__ = ["IdentityRecord", "IdentityRegistry", "hash_password", "verify_password"]

_PREFIX = "identity/"
_SEALED = "key_sealed"  # the record's field holding its symmetric key sealed (the key_b64 field is then null)
# scrypt cost: n=2**14, r=8, p=1 (16 MiB, ~50 ms on a Raspberry Pi 4): paid once per connect, not per message.
_N, _R, _P = 1 << 14, 8, 1


def hash_password(password: bytes, *, salt: bytes | None = None) -> str:
    """``scrypt$n$r$p$salt_b64$hash_b64``."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(password, salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"scrypt${_N}${_R}${_P}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def _same(a: str, b: str) -> bool:
    """Constant-time equality of two texts, whatever their characters (``compare_digest`` takes ASCII str only)."""
    return hmac.compare_digest(a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass"))


def _storable(text: str) -> bool:
    """Whether ``text`` can be a metadata key (UTF-8: a lone surrogate cannot)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def verify_password(password: bytes, encoded: str) -> bool:
    try:
        scheme, n, r, p, salt_b64, digest_b64 = encoded.split("$")
        if scheme != "scrypt":
            return False
        salt, digest = base64.b64decode(salt_b64), base64.b64decode(digest_b64)
        got = hashlib.scrypt(password, salt=salt, n=int(n), r=int(r), p=int(p), dklen=len(digest))
    except ValueError:
        return False
    return hmac.compare_digest(got, digest)


@dataclass(frozen=True, slots=True)
class IdentityRecord:
    key_b64: str | None = None
    password_hash: str | None = None
    thumbprint: str | None = None
    x509_ca: bool = False
    # The device that stands between this one and the hub (a child hub, logged in as that device): it may take
    # this device's cloud-to-device messages and method calls for it (protocol_heads.mqtt.children).
    parent: str | None = None


class IdentityRegistry:
    """Reads and writes identity records in ``store``'s metadata; authenticates credentials against them."""

    def __init__(
        self,
        store: Store,
        *,
        host_name: str,
        clock: Clock,
        max_token_lifetime_s: float | None = DEFAULT_MAX_TOKEN_LIFETIME_S,
        sealer: SecretSealer | None = None,
    ) -> None:
        if max_token_lifetime_s is not None and max_token_lifetime_s <= 0:
            raise ValueError("max_token_lifetime_s must be positive (None: no limit)")
        self._store = store
        self.host_name = host_name
        self._clock = clock
        self.max_token_lifetime_s = max_token_lifetime_s
        self._sealer = sealer

    def get(self, identity: Identity) -> IdentityRecord | None:
        raw = self._store.get_metadata(_PREFIX + identity.id)
        if raw is None:
            return None
        return self._decode(identity.id, raw)[0]

    def _decode(self, identity_id: str, raw: bytes) -> tuple[IdentityRecord, bool]:
        """The record, and whether its symmetric key is there but cannot be opened (sealed under another key, or
        with no sealer): such a record has no key, so a SAS login with it fails as with a wrong key."""
        fields = json.loads(raw)
        sealed = fields.pop(_SEALED, None)
        record = IdentityRecord(**fields)
        if sealed is None:
            return record, False
        if self._sealer is None:
            return record, True
        try:
            key = self._sealer.unseal(str(sealed), bound_to=identity_id)
        except SealedSecretError:
            return record, True
        return replace(record, key_b64=key.decode("ascii")), False

    def _encode(self, identity: Identity, record: IdentityRecord) -> bytes:
        fields: dict[str, object] = asdict(record)
        if self._sealer is not None and record.key_b64 is not None:
            fields["key_b64"] = None
            fields[_SEALED] = self._sealer.seal(record.key_b64.encode("ascii"), bound_to=identity.id)
        return json.dumps(fields).encode()

    async def seal_clear_keys(self) -> tuple[int, int]:
        """Seal every symmetric key an older hub kept in clear, then make the clear values leave the store's
        files (``Store.drop_overwritten_metadata``). Returns (keys sealed now, keys that cannot be opened); both
        0 without a sealer or with nothing to do."""
        if self._sealer is None:
            return 0, 0
        sealed_now, unopenable = 0, 0
        for key, raw in self._store.metadata_items(_PREFIX):
            identity = Identity.parse(key[len(_PREFIX) :])
            record, lost = self._decode(identity.id, raw)
            unopenable += lost
            if record.key_b64 is not None and _SEALED not in json.loads(raw):
                await self.put(identity, record)
                sealed_now += 1
        if sealed_now:
            await self._store.drop_overwritten_metadata()
        return sealed_now, unopenable

    def device_ids(self, limit: int = 10_000) -> list[str]:
        """The device ids of the known identities (a module's device once), at most ``limit``, in order."""
        out: dict[str, None] = {}
        for key, _ in self._store.metadata_items(_PREFIX):
            device = key[len(_PREFIX) :].partition("/")[0]
            if device and device not in out:
                out[device] = None
                if len(out) >= limit:
                    break
        return list(out)

    async def put(self, identity: Identity, record: IdentityRecord) -> None:
        await self._store.put_metadata(_PREFIX + identity.id, self._encode(identity, record))

    async def add_symmetric_key(self, identity: Identity, key_b64: str | None = None) -> str:
        """Give ``identity`` a symmetric key (a fresh 32-byte one unless given); returns it."""
        key = key_b64 or base64.b64encode(secrets.token_bytes(32)).decode()
        await self.put(identity, replace(self.get(identity) or IdentityRecord(), key_b64=key))
        return key

    def identities(self) -> list[tuple[Identity, IdentityRecord]]:
        """Every identity with its record, in id order."""
        out = []
        for key, raw in self._store.metadata_items(_PREFIX):
            identity = Identity.parse(key[len(_PREFIX) :])
            out.append((identity, self._decode(identity.id, raw)[0]))
        return out

    async def remove(self, identity: Identity) -> bool:
        """Delete the identity's record (durably); False when there was none. Its twin and queued messages stay."""
        if self.get(identity) is None:
            return False
        await self._store.put_metadata(_PREFIX + identity.id, None)
        return True

    async def set_password(self, identity: Identity, password: bytes) -> None:
        await self.put(identity, replace(self.get(identity) or IdentityRecord(), password_hash=hash_password(password)))

    async def set_thumbprint(self, identity: Identity, thumbprint: str) -> None:
        await self.put(identity, replace(self.get(identity) or IdentityRecord(), thumbprint=thumbprint.lower()))

    async def set_parent(self, identity: Identity, parent: Identity | None) -> None:
        """Make ``parent`` (a device; None: none) the gateway ``identity`` is behind."""
        if parent is not None and parent.module_id is not None:
            raise ValueError(f"a parent is a device, not the module {parent}")
        value = parent.id if parent is not None else None
        await self.put(identity, replace(self.get(identity) or IdentityRecord(), parent=value))

    def is_parent(self, parent: Identity, child: Identity) -> bool:
        """Whether ``child`` (a device, or a module of one) is behind ``parent``."""
        record = self.get(Identity.parse(child.device_id))
        return record is not None and record.parent is not None and record.parent == parent.id

    async def allow_ca_signed(self, identity: Identity) -> None:
        await self.put(identity, replace(self.get(identity) or IdentityRecord(), x509_ca=True))

    async def authenticate(self, credentials: Credentials) -> AuthResult:
        """Raises ``AuthenticationError`` unless one of the identity's secrets matches. scrypt runs in a thread
        (it takes tens of milliseconds on purpose)."""
        identity = credentials.identity
        if not _storable(identity.id):
            raise AuthenticationError("identity is not valid UTF-8 text")
        record = self.get(identity)
        if record is None:
            raise AuthenticationError(f"unknown identity {identity}")
        if credentials.cert_thumbprint is not None:
            if record.thumbprint is not None and _same(credentials.cert_thumbprint.lower(), record.thumbprint):
                return AuthResult(identity, "x509")
            if record.x509_ca and credentials.cert_chain_verified and credentials.cert_subject_cn == identity.id:
                return AuthResult(identity, "x509")
        password = credentials.password
        if password is None:
            raise AuthenticationError(f"no usable credentials for {identity}")
        if password.startswith(b"SharedAccessSignature ") and record.key_b64 is not None:
            verify_sas_token(
                password.decode("utf-8", errors="replace"),
                resource=resource_uri(self.host_name, identity),
                key_b64=record.key_b64,
                clock=self._clock,
                max_lifetime_s=self.max_token_lifetime_s,
            )
            return AuthResult(identity, "sas")
        if record.password_hash is not None and await asyncio.to_thread(
            verify_password, password, record.password_hash
        ):
            return AuthResult(identity, "password")
        raise AuthenticationError(f"bad credentials for {identity}")
