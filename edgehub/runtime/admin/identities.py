"""Identities managed while the hub runs or not: one set of operations (``IdentityAdmin``) that the admin API
serves on the running hub's registry and the CLI runs on a stopped hub's data directory, so both behave alike.

An identity is added with one way to log in (``IdentitySpec.auth``): ``sas`` (a symmetric key, given or made),
``x509`` (a certificate's SHA-256 thumbprint), ``x509-ca`` (any certificate that chains to the hub's CAs and
names the identity as its CN) or ``password`` (kept as a scrypt hash). Adding to an identity that exists adds
that way to it (a key given replaces the old key). ``remove`` deletes the identity's record; ``rotate-key``
gives it a fresh symmetric key. Both close its live connections at once (``close_connections``, every protocol
head's ``close_identity`` on a running hub); its queued messages and its twin stay.

Routes (``identity_routes``; bearer token as for every admin route):

| ``GET /identities`` | every identity and its ways to log in (never a secret) |
| ``POST /identities`` | add: ``{"id", "auth", "key"?, "thumbprint"?, "password"?}`` → ``{"id", "auth", "key"?}`` |
| ``DELETE /identities/{device}[/{module}]`` | remove → ``{"removed", "closed"}`` |
| ``POST /identities/{device}[/{module}]/rotate-key`` | a new key → ``{"id", "key", "closed"}`` |

Invariants: every field is checked before anything is written (an ``IdentityError`` names the field); a secret is
never logged and never listed; a record is durable before an answer says it was written.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from edgehub.core import Identity
from edgehub.hub.identities import IdentityRecord, IdentityRegistry
from edgehub.runtime.admin.api import BadRequest, RouteHandler, json_object
from edgehub.runtime.admin.http import Request, Response

__all__ = ["AUTH_KINDS", "IdentityAdmin", "IdentityError", "IdentitySpec", "identity_routes", "ways_of"]

log = logging.getLogger(__name__)

AUTH_KINDS = ("sas", "x509", "x509-ca", "password")
_THUMBPRINT = re.compile(r"[0-9a-fA-F]{64}")
# IoT Hub's rule for device and module ids (up to 128 ASCII letters, digits and these marks): an added identity
# must be one a device SDK can name.
_IOT_HUB_ID = re.compile(r"[A-Za-z0-9\-.+%_#*?!(),:=@$']{1,128}")
_MAX_PASSWORD = 1024
_MIN_KEY_BYTES, _MAX_KEY_BYTES = 16, 64  # IoT Hub's keys are 16 to 64 bytes


class IdentityError(ValueError):
    """An identity operation refused: what is wrong, naming the field."""


@dataclass(frozen=True, slots=True)
class IdentitySpec:
    """What ``add`` is asked: one identity and one way for it to log in."""

    identity: Identity
    auth: str = "sas"
    key_b64: str | None = None
    thumbprint: str | None = None
    password: str | None = None
    parent: Identity | None = None  # the device (a child hub) this device sits behind (protocol_heads.mqtt.children)

    @classmethod
    def from_json(cls, value: dict[str, object]) -> IdentitySpec:
        names = ("id", "auth", "key", "thumbprint", "password", "parent")
        unknown = set(value) - set(names)
        if unknown:
            raise IdentityError(f"{sorted(unknown)[0]}: unknown field")
        fields = {name: value.get(name) for name in names}
        for name, v in fields.items():
            if v is not None and not isinstance(v, str):
                raise IdentityError(f"{name}: must be a string")
        if not fields["id"]:
            raise IdentityError("id: missing")
        return cls(
            parse_identity(str(fields["id"])),
            str(fields["auth"] or "sas"),
            _opt(fields["key"]),
            _opt(fields["thumbprint"]),
            _opt(fields["password"]),
            None if fields["parent"] is None else parse_identity(str(fields["parent"]), field="parent"),
        ).checked()

    def checked(self) -> IdentitySpec:
        for part in (self.identity.device_id, self.identity.module_id):
            if part is not None and not _IOT_HUB_ID.fullmatch(part):
                raise IdentityError(
                    f"id: {part[:140]!r} is not an IoT Hub id (1 to 128 letters, digits, -.+%_#*?!(),:=@$')"
                )
        if self.auth not in AUTH_KINDS:
            raise IdentityError(f"auth: one of {', '.join(AUTH_KINDS)}, not {self.auth!r}")
        given = {"key": self.key_b64, "thumbprint": self.thumbprint, "password": self.password}
        needs = {"sas": None, "x509": "thumbprint", "x509-ca": None, "password": "password"}[self.auth]
        for name, v in given.items():
            if v is not None and name != needs and not (self.auth == "sas" and name == "key"):
                raise IdentityError(f"{name}: not taken with auth {self.auth}")
        if needs is not None and given[needs] is None:
            raise IdentityError(f"{needs}: needed with auth {self.auth}")
        if self.key_b64 is not None:
            try:
                key = base64.b64decode(self.key_b64, validate=True)
            except (binascii.Error, ValueError):
                raise IdentityError("key: not base64") from None
            if not _MIN_KEY_BYTES <= len(key) <= _MAX_KEY_BYTES:
                raise IdentityError(f"key: {_MIN_KEY_BYTES} to {_MAX_KEY_BYTES} bytes")
        if self.thumbprint is not None and not _THUMBPRINT.fullmatch(self.thumbprint):
            raise IdentityError("thumbprint: the certificate's SHA-256 as 64 hex digits")
        if self.password is not None and not 1 <= len(self.password) <= _MAX_PASSWORD:
            raise IdentityError(f"password: 1 to {_MAX_PASSWORD} characters")
        if self.parent is not None and (
            self.identity.module_id is not None or self.parent.module_id is not None or self.parent == self.identity
        ):
            raise IdentityError("parent: a device sits behind another device (a child hub), not a module")
        return self


def _opt(value: object) -> str | None:
    return None if value is None else str(value)


def parse_identity(text: str, *, field: str = "id") -> Identity:
    try:
        return Identity.parse(text)
    except ValueError as exc:
        raise IdentityError(f"{field}: {exc}") from None


def ways_of(record: IdentityRecord) -> list[str]:
    """The ways an identity may log in, by name (``AUTH_KINDS``)."""
    ways = []
    if record.key_b64 is not None:
        ways.append("sas")
    if record.thumbprint is not None:
        ways.append("x509")
    if record.x509_ca:
        ways.append("x509-ca")
    if record.password_hash is not None:
        ways.append("password")
    return ways


class IdentityAdmin:
    """The operations; ``close_connections(identity_id)`` ends that identity's live connections (returns how
    many; offline there are none)."""

    def __init__(self, registry: IdentityRegistry, close_connections: Callable[[str], int] = lambda _: 0) -> None:
        self.registry = registry
        self._close = close_connections

    async def add(self, spec: IdentitySpec) -> str | None:
        """Add ``spec``'s way to log in; the symmetric key for ``sas`` (None otherwise)."""
        spec = spec.checked()
        ident, reg = spec.identity, self.registry
        key = None
        if spec.auth == "sas":
            key = await reg.add_symmetric_key(ident, spec.key_b64)
        elif spec.auth == "x509":
            assert spec.thumbprint is not None
            await reg.set_thumbprint(ident, spec.thumbprint)
        elif spec.auth == "x509-ca":
            await reg.allow_ca_signed(ident)
        else:
            assert spec.password is not None
            await reg.set_password(ident, spec.password.encode())
        if spec.parent is not None:
            await reg.set_parent(ident, spec.parent)
        log.info("admin.identity_added identity=%s auth=%s parent=%s", ident, spec.auth, spec.parent)
        return key

    def list(self) -> list[dict[str, object]]:
        return [{"id": ident.id, "auth": ways_of(record)} for ident, record in self.registry.identities()]

    async def remove(self, identity: Identity) -> tuple[bool, int]:
        """(whether it existed, connections closed)."""
        removed = await self.registry.remove(identity)
        closed = self._close(identity.id)
        log.info("admin.identity_removed identity=%s existed=%s closed=%d", identity, removed, closed)
        return removed, closed

    async def rotate_key(self, identity: Identity) -> tuple[str, int]:
        """A fresh symmetric key for ``identity`` (which must have one); (the key, connections closed)."""
        record = self.registry.get(identity)
        if record is None:
            raise IdentityError(f"id: no identity {identity}")
        if record.key_b64 is None:
            raise IdentityError(f"id: {identity} has no symmetric key to rotate (it logs in by {ways_of(record)})")
        key = await self.registry.add_symmetric_key(identity)
        closed = self._close(identity.id)
        log.info("admin.identity_key_rotated identity=%s closed=%d", identity, closed)
        return key, closed


def identity_routes(admin: IdentityAdmin) -> list[tuple[str, str, RouteHandler, bool]]:
    """The identity routes for ``AdminApi.add_routes``."""

    async def listed(request: Request, params: tuple[str, ...]) -> Response:
        return Response.json(200, {"identities": admin.list()})

    async def added(request: Request, params: tuple[str, ...]) -> Response:
        try:
            spec = IdentitySpec.from_json(json_object(request))
            key = await admin.add(spec)
        except IdentityError as exc:
            raise BadRequest(str(exc)) from None
        answer: dict[str, object] = {"id": spec.identity.id, "auth": spec.auth}
        if key is not None:
            answer["key"] = key
        return Response.json(200, answer)

    async def removed(request: Request, params: tuple[str, ...]) -> Response:
        try:
            identity = parse_identity(params[0])
        except IdentityError as exc:
            raise BadRequest(str(exc)) from None
        existed, closed = await admin.remove(identity)
        if not existed:
            raise BadRequest(f"no identity {identity}", status=404)
        return Response.json(200, {"id": identity.id, "removed": True, "closed": closed})

    async def rotated(request: Request, params: tuple[str, ...]) -> Response:
        head, _, action = params[0].rpartition("/")
        if action != "rotate-key" or not head:
            raise BadRequest(f"no action {action!r} (POST .../rotate-key)", status=404)
        try:
            key, closed = await admin.rotate_key(parse_identity(head))
        except IdentityError as exc:
            raise BadRequest(str(exc), status=404 if "no identity" in str(exc) else 400) from None
        return Response.json(200, {"id": head, "key": key, "closed": closed})

    return [
        ("GET", "/identities", listed, False),
        ("POST", "/identities", added, False),
        ("DELETE", "/identities/{*}", removed, False),
        ("POST", "/identities/{*}", rotated, False),
    ]
