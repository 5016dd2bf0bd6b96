"""Shared access signatures and connection strings, the IoT Hub way. Standard library only.

A token is ``SharedAccessSignature sr={URL-encoded resource}&sig={URL-encoded signature}&se={expiry}``
(optionally ``&skn={policy}``). The signature is base64(HMAC-SHA256(base64-decoded key, sr + "\\n" + se)),
where sr is the URL-encoded resource exactly as it appears in the token, and the resource of an identity is
``{HostName}/devices/{deviceId}[/modules/{moduleId}]``.

Invariants:
* ``parse_sas_token`` and ``verify_sas_token`` raise ``AuthenticationError`` (with the reason) for a malformed
  token, a wrong resource, a bad signature, an expired one or one that lives longer than ``max_lifetime_s``;
  they never raise anything else, whatever the text (``tests/core/test_sas_fuzz.py`` holds them to it).
  Signatures are compared in constant time.
* Every input is bounded before it is worked on: a token is ASCII (tokens are URL-encoded) and at most
  ``MAX_TOKEN_CHARS`` long; ``se`` is 1 to ``MAX_EXPIRY_DIGITS`` ASCII digits (``str.isdigit`` alone takes
  ``"²"``, which ``int`` refuses, and ``int`` refuses 5,000 digits); a connection string is at most
  ``MAX_CONNECTION_STRING_CHARS`` long and ``ConnectionString.parse`` raises ``ValueError`` only.
* Expiry is checked against the given ``Clock`` (so tests can steer it); ``se`` is epoch seconds.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import quote, unquote

from edgehub.core.clock import Clock
from edgehub.core.errors import AuthenticationError
from edgehub.core.identity import DeviceId, Identity, ModuleId

__all__ = [
    "DEFAULT_MAX_TOKEN_LIFETIME_S",
    "MAX_CONNECTION_STRING_CHARS",
    "MAX_EXPIRY_DIGITS",
    "MAX_TOKEN_CHARS",
    "ConnectionString",
    "SasToken",
    "generate_sas_token",
    "parse_sas_token",
    "resource_uri",
    "verify_sas_token",
]

_PREFIX = "SharedAccessSignature "
# A device token is ~150 characters (host, device and module ids of up to 128 each, a 44-character signature):
# 4 KiB leaves room for long names and policies, and bounds what parsing costs.
MAX_TOKEN_CHARS = 4096
MAX_CONNECTION_STRING_CHARS = 4096
# 12 digits is epoch seconds up to the year 33658; more is no date a clock reaches, only work for ``int``.
MAX_EXPIRY_DIGITS = 12
# How far ahead a token's expiry may be, by default (a token with se = 10**30 never expires, so a leaked one
# could never be revoked short of changing the key). Devices renew theirs, the SDKs hourly.
DEFAULT_MAX_TOKEN_LIFETIME_S = 365 * 86_400
_FIELDS_MAX = 8  # sr, sig, se, skn and a few unknown ones: more is not a token


def resource_uri(host_name: str, identity: Identity) -> str:
    """``{host}/devices/{d}[/modules/{m}]``: what a device or module token is scoped to (not URL-encoded)."""
    uri = f"{host_name}/devices/{identity.device_id}"
    if identity.module_id is not None:
        uri += f"/modules/{identity.module_id}"
    return uri


def _sign(key_b64: str, string_to_sign: str) -> str:
    try:
        key = base64.b64decode(key_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("the shared access key is not base64") from exc
    return base64.b64encode(hmac.new(key, string_to_sign.encode(), hashlib.sha256).digest()).decode()


def generate_sas_token(resource: str, key_b64: str, expiry_s: int, *, policy: str | None = None) -> str:
    """A token for ``resource`` (not yet URL-encoded) that expires at ``expiry_s`` epoch seconds."""
    sr = quote(resource, safe="")
    sig = _sign(key_b64, f"{sr}\n{expiry_s}")
    token = f"{_PREFIX}sr={sr}&sig={quote(sig, safe='')}&se={expiry_s}"
    if policy:
        token += f"&skn={quote(policy, safe='')}"
    return token


@dataclass(frozen=True, slots=True)
class SasToken:
    """A parsed token. ``sr_raw`` is the resource as it appeared in the token (still URL-encoded): the
    signature covers exactly that text."""

    resource: str
    sr_raw: str
    signature: str
    expiry_s: int
    policy: str | None = None


def parse_sas_token(token: str) -> SasToken:
    """Parse a token; raises AuthenticationError (and nothing else) when it is not one."""
    if len(token) > MAX_TOKEN_CHARS:
        raise AuthenticationError(f"SAS token longer than {MAX_TOKEN_CHARS} characters")
    if not token.isascii():
        raise AuthenticationError("SAS token is not ASCII (its fields are URL-encoded)")
    if not token.startswith(_PREFIX):
        raise AuthenticationError("not a SharedAccessSignature token")
    raw: dict[str, str] = {}
    parts = token[len(_PREFIX) :].split("&", _FIELDS_MAX)
    if len(parts) > _FIELDS_MAX:
        raise AuthenticationError(f"SAS token with more than {_FIELDS_MAX} fields")
    for part in parts:
        name, sep, value = part.partition("=")
        if not sep or name in raw:
            raise AuthenticationError(f"malformed SAS token field {name[:32]!r}")
        raw[name] = value
    try:
        sr, sig, se = raw["sr"], raw["sig"], raw["se"]
    except KeyError as exc:
        raise AuthenticationError(f"SAS token without {exc.args[0]}") from exc
    # isascii first: str.isdigit takes superscripts and other scripts' digits, which int() refuses or reads.
    if not (0 < len(se) <= MAX_EXPIRY_DIGITS and se.isascii() and se.isdigit()):
        raise AuthenticationError(f"SAS token expiry is not 1 to {MAX_EXPIRY_DIGITS} digits")
    if not sr or not sig:
        raise AuthenticationError("SAS token with an empty sr or sig")
    skn = raw.get("skn")
    # unquote of ASCII text cannot fail (a bad %-escape is kept as it is, bad UTF-8 becomes U+FFFD).
    return SasToken(unquote(sr), sr, unquote(sig), int(se), unquote(skn) if skn is not None else None)


def verify_sas_token(
    token: str, *, resource: str, key_b64: str, clock: Clock, max_lifetime_s: float | None = None
) -> SasToken:
    """Check that ``token`` is for ``resource`` (case-insensitive, as IoT Hub host names are), signed with
    ``key_b64``, not expired at ``clock.time()`` and (with ``max_lifetime_s``) not expiring more than that many
    seconds after it. Returns the parsed token; raises ``AuthenticationError`` with the reason."""
    parsed = parse_sas_token(token)
    if parsed.resource.rstrip("/").lower() != resource.rstrip("/").lower():
        raise AuthenticationError(f"SAS token is for {parsed.resource!r}, not {resource!r}")
    try:
        expected = _sign(key_b64, f"{parsed.sr_raw}\n{parsed.expiry_s}")
    except ValueError as exc:
        raise AuthenticationError("the identity's key is not base64") from exc
    # The signature was unquoted from ASCII, so it may hold U+FFFD: compare UTF-8 bytes (compare_digest takes
    # only ASCII str).
    if not hmac.compare_digest(expected.encode(), parsed.signature.encode()):
        raise AuthenticationError(f"SAS token signature does not match for {resource!r}")
    now = clock.time()
    if parsed.expiry_s <= now:
        raise AuthenticationError(f"SAS token for {resource!r} expired at {parsed.expiry_s}")
    if max_lifetime_s is not None and parsed.expiry_s - now > max_lifetime_s:
        raise AuthenticationError(
            f"SAS token for {resource!r} expires in {parsed.expiry_s - now:.0f} s, over the hub's maximum token "
            f"lifetime of {max_lifetime_s:.0f} s"
        )
    return parsed


@dataclass(frozen=True, slots=True)
class ConnectionString:
    """``HostName=...;DeviceId=...;ModuleId=...;SharedAccessKey=...;GatewayHostName=...``.

    ``format()`` writes the fields in that order; ``parse`` accepts any order and keeps unknown keys out
    (they raise ValueError, so that a typo is not silently ignored)."""

    host_name: str
    device_id: str
    shared_access_key: str | None = None
    module_id: str | None = None
    gateway_host_name: str | None = None
    shared_access_key_name: str | None = None

    _FIELDS = {
        "HostName": "host_name",
        "DeviceId": "device_id",
        "ModuleId": "module_id",
        "SharedAccessKey": "shared_access_key",
        "SharedAccessKeyName": "shared_access_key_name",
        "GatewayHostName": "gateway_host_name",
    }

    @property
    def identity(self) -> Identity:
        # Each part checked on its own: DeviceId=a/b is no device (joined and parsed, it would name module b of a).
        return Identity(DeviceId(self.device_id), None if self.module_id is None else ModuleId(self.module_id))

    @classmethod
    def parse(cls, text: str) -> ConnectionString:
        """Parse ``text``; raises ``ValueError`` (and nothing else) when it is not a connection string."""
        if len(text) > MAX_CONNECTION_STRING_CHARS:
            raise ValueError(f"a connection string is at most {MAX_CONNECTION_STRING_CHARS} characters")
        values: dict[str, str] = {}
        for part in text.strip().strip(";").split(";", len(cls._FIELDS)):
            # Keys are base64 and may end in '=': split at the first '=' only.
            name, sep, value = part.strip().partition("=")
            attr = cls._FIELDS.get(name)
            if not sep or attr is None:
                raise ValueError(f"unknown connection string field {name[:32]!r}")
            if attr in values:
                raise ValueError(f"connection string field {name!r} given twice")
            values[attr] = value
        if "host_name" not in values or "device_id" not in values:
            raise ValueError("a connection string needs HostName and DeviceId")
        parsed = cls(**values)
        _ = parsed.identity  # raises ValueError for a device or module id that cannot be one
        return parsed

    def format(self) -> str:
        parts = []
        for name, attr in self._FIELDS.items():
            value = getattr(self, attr)
            if value is not None:
                parts.append(f"{name}={value}")
        return ";".join(parts)

    def resource(self) -> str:
        return resource_uri(self.host_name, self.identity)

    def sas_token(self, expiry_s: int) -> str:
        """A device or module token signed with this connection string's key."""
        if self.shared_access_key is None:
            raise ValueError("connection string has no SharedAccessKey")
        return generate_sas_token(self.resource(), self.shared_access_key, expiry_s)

    def __str__(self) -> str:
        return self.format()
