"""SAS tokens and connection strings against independently computed vectors (openssl, and the algorithm as the
IoT Hub documentation's Python sample writes it)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import quote_plus, urlencode

import pytest

from edgehub.core import AuthenticationError, Identity
from edgehub.core.sas import (
    ConnectionString,
    generate_sas_token,
    parse_sas_token,
    resource_uri,
    verify_sas_token,
)
from edgehub.testing import ManualClock

KEY = "ZWRnZWh1Yi10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVm"  # base64 of "edgehub-test-key-0123456789abcdef"
# printf 'myhub.azure-devices.net%2Fdevices%2Fdev1\n1700003600' | openssl dgst -sha256 -hmac '<key>' -binary | base64
OPENSSL_SIG = "ehtQG5e2mfi43og2KnkjKqmDoqhRhop/nsPRLo5J0ds="
RESOURCE = "myhub.azure-devices.net/devices/dev1"


def documented_token(uri: str, key: str, expiry: int) -> str:
    """The IoT Hub security guide's Python sample, written out independently of edgehub."""
    sign_key = f"{quote_plus(uri)}\n{expiry}"
    signature = base64.b64encode(hmac.new(base64.b64decode(key), sign_key.encode(), hashlib.sha256).digest())
    return "SharedAccessSignature " + urlencode({"sr": uri, "sig": signature, "se": str(expiry)})


def test_generated_token_matches_the_openssl_vector() -> None:
    token = generate_sas_token(RESOURCE, KEY, 1_700_003_600)
    assert token == (
        f"SharedAccessSignature sr=myhub.azure-devices.net%2Fdevices%2Fdev1&sig={quote_plus(OPENSSL_SIG)}&se=1700003600"
    )


def test_generated_token_matches_the_documented_algorithm() -> None:
    assert generate_sas_token(RESOURCE, KEY, 1_700_003_600) == documented_token(RESOURCE, KEY, 1_700_003_600)


def test_token_made_the_documented_way_verifies() -> None:
    clock = ManualClock(start=1_700_000_000)
    token = documented_token(RESOURCE, KEY, 1_700_003_600)
    parsed = verify_sas_token(token, resource=RESOURCE, key_b64=KEY, clock=clock)
    assert parsed.resource == RESOURCE
    assert parsed.expiry_s == 1_700_003_600


def test_expired_token_is_refused_when_the_clock_passes_expiry() -> None:
    clock = ManualClock(start=1_700_000_000)
    token = generate_sas_token(RESOURCE, KEY, 1_700_000_010)
    verify_sas_token(token, resource=RESOURCE, key_b64=KEY, clock=clock)
    clock.advance(10)
    with pytest.raises(AuthenticationError, match="expired"):
        verify_sas_token(token, resource=RESOURCE, key_b64=KEY, clock=clock)


def test_token_signed_with_another_key_is_refused() -> None:
    other = base64.b64encode(b"another key").decode()
    token = generate_sas_token(RESOURCE, other, 1_800_000_000)
    with pytest.raises(AuthenticationError, match="signature"):
        verify_sas_token(token, resource=RESOURCE, key_b64=KEY, clock=ManualClock())


def test_token_for_another_device_is_refused() -> None:
    token = generate_sas_token("myhub.azure-devices.net/devices/dev2", KEY, 1_800_000_000)
    with pytest.raises(AuthenticationError, match="not"):
        verify_sas_token(token, resource=RESOURCE, key_b64=KEY, clock=ManualClock())


def test_tampered_expiry_breaks_the_signature() -> None:
    token = generate_sas_token(RESOURCE, KEY, 1_700_003_600).replace("se=1700003600", "se=1900003600")
    with pytest.raises(AuthenticationError, match="signature"):
        verify_sas_token(token, resource=RESOURCE, key_b64=KEY, clock=ManualClock())


@pytest.mark.parametrize(
    "token",
    [
        "",
        "Bearer x",
        "SharedAccessSignature sr=a&sig=b",
        "SharedAccessSignature sr=a&sig=b&se=soon",
        "SharedAccessSignature x",
    ],
)
def test_malformed_tokens_raise_authentication_error(token: str) -> None:
    with pytest.raises(AuthenticationError):
        parse_sas_token(token)


def test_module_resource_uri_has_the_modules_segment() -> None:
    assert resource_uri("h", Identity.parse("d/m")) == "h/devices/d/modules/m"
    assert resource_uri("h", Identity.parse("d")) == "h/devices/d"


def test_connection_string_round_trips_and_signs_for_its_identity() -> None:
    text = f"HostName=myhub.azure-devices.net;DeviceId=dev1;ModuleId=filter;SharedAccessKey={KEY};GatewayHostName=gw"
    cs = ConnectionString.parse(text)
    assert cs.identity == Identity.parse("dev1/filter")
    assert cs.gateway_host_name == "gw"
    assert cs.shared_access_key == KEY  # the trailing '=' of base64 survives
    assert ConnectionString.parse(cs.format()) == cs
    token = cs.sas_token(1_800_000_000)
    verify_sas_token(
        token, resource="myhub.azure-devices.net/devices/dev1/modules/filter", key_b64=KEY, clock=ManualClock()
    )


def test_connection_string_with_unknown_or_missing_fields_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown"):
        ConnectionString.parse("HostName=h;DeviceId=d;Sharedaccesskey=x")
    with pytest.raises(ValueError, match="needs"):
        ConnectionString.parse("HostName=h")
