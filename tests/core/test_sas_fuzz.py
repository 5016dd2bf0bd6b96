"""SAS tokens and connection strings from hostile text: only ``AuthenticationError`` (tokens) or ``ValueError``
(connection strings, as documented) ever comes out, whatever the input, and malformed expiries are refused with
a reason instead of a traceback."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgehub.core import AuthenticationError, Identity
from edgehub.core.sas import (
    MAX_TOKEN_CHARS,
    ConnectionString,
    generate_sas_token,
    parse_sas_token,
    resource_uri,
    verify_sas_token,
)
from edgehub.hub import Credentials
from edgehub.hub.facade import EdgeHub
from edgehub.routing import Router
from edgehub.store import Store
from edgehub.testing import ManualClock

pytestmark = pytest.mark.timeout(60)

KEY = base64.b64encode(b"k" * 32).decode()
RESOURCE = "hub.test/devices/dev1"
NOW = 1_700_000_000.0
YEAR_S = 365 * 86_400


def token_with_expiry(se: str) -> str:
    return f"SharedAccessSignature sr=hub.test%2Fdevices%2Fdev1&sig=abc&se={se}"


@pytest.mark.parametrize(
    "se",
    ["²", "١٢٣", "9" * 5000, "9" * 13, "", "-1", "+5", " 5", "1_000"],
    ids=["superscript", "arabic-indic", "5000-digits", "13-digits", "empty", "negative", "plus", "space", "underscore"],
)
def test_a_malformed_expiry_is_an_authentication_error_with_a_reason(se: str) -> None:
    with pytest.raises(AuthenticationError, match=r"expiry|longer than|not ASCII"):
        parse_sas_token(token_with_expiry(se))


def test_an_overlong_token_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(AuthenticationError, match=f"longer than {MAX_TOKEN_CHARS}"):
        parse_sas_token("SharedAccessSignature sr=a&sig=b&se=1&x=" + "a" * 1_000_000)


def test_a_token_with_thousands_of_fields_is_refused() -> None:
    with pytest.raises(AuthenticationError, match="more than"):
        parse_sas_token("SharedAccessSignature " + "&".join(f"f{i}=1" for i in range(500)))


def test_a_token_expiring_past_the_maximum_lifetime_is_refused_naming_the_limit() -> None:
    clock = ManualClock(NOW)
    far = generate_sas_token(RESOURCE, KEY, 10**30)
    with pytest.raises(AuthenticationError):  # 31 digits: not a date, whatever the limit
        verify_sas_token(far, resource=RESOURCE, key_b64=KEY, clock=clock, max_lifetime_s=YEAR_S)
    too_long = generate_sas_token(RESOURCE, KEY, int(NOW) + YEAR_S + 60)
    with pytest.raises(AuthenticationError, match=f"maximum token lifetime of {YEAR_S} s"):
        verify_sas_token(too_long, resource=RESOURCE, key_b64=KEY, clock=clock, max_lifetime_s=YEAR_S)
    within = generate_sas_token(RESOURCE, KEY, int(NOW) + YEAR_S - 60)
    assert verify_sas_token(within, resource=RESOURCE, key_b64=KEY, clock=clock, max_lifetime_s=YEAR_S)
    assert verify_sas_token(too_long, resource=RESOURCE, key_b64=KEY, clock=clock)  # no limit given


async def test_the_hub_refuses_a_token_over_its_maximum_lifetime_and_takes_one_within() -> None:
    clock = ManualClock(NOW)
    dev = Identity.parse("dev1")
    router = Router({"all": "FROM /* INTO $upstream"})
    async with EdgeHub(store=Store.in_memory(), router=router, host_name="hub.test", clock=clock) as hub:
        await hub.identities.add_symmetric_key(dev, KEY)
        far = generate_sas_token(resource_uri("hub.test", dev), KEY, int(NOW) + 2 * YEAR_S).encode()
        with pytest.raises(AuthenticationError, match="maximum token lifetime"):
            await hub.authenticate(Credentials(dev, password=far))
        near = generate_sas_token(resource_uri("hub.test", dev), KEY, int(NOW) + 3600).encode()
        assert (await hub.authenticate(Credentials(dev, password=near))).auth_method == "sas"
    short = Router({"all": "FROM /* INTO $upstream"})
    store = Store.in_memory()
    async with EdgeHub(store=store, router=short, host_name="hub.test", clock=clock, max_token_lifetime_s=600) as hub:
        await hub.identities.add_symmetric_key(dev, KEY)
        with pytest.raises(AuthenticationError, match="maximum token lifetime of 600 s"):
            await hub.authenticate(Credentials(dev, password=near))


# -- Hypothesis: nothing but the declared errors --------------------------------------------------------------

_pieces = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["sr=", "sig=", "se=", "skn=", "&", "=", "%", "%zz", "%ff", "%C3", "²", "9" * 50, "\n"]),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.binary(max_size=24).map(lambda b: base64.b64encode(b).decode()),
)
_tokens = st.one_of(
    st.text(max_size=300),
    st.lists(_pieces, max_size=12).map(lambda parts: "SharedAccessSignature " + "".join(parts)),
    st.builds(
        lambda sr, sig, se, extra: f"SharedAccessSignature sr={sr}&sig={sig}&se={se}{extra}",
        _pieces,
        _pieces,
        _pieces,
        st.text(max_size=20),
    ),
)


@settings(max_examples=400, deadline=None)
@given(_tokens)
def test_parse_sas_token_raises_only_authentication_error(token: str) -> None:
    try:
        parse_sas_token(token)
    except AuthenticationError:
        pass


@settings(max_examples=400, deadline=None)
@given(_tokens, st.one_of(st.just(KEY), st.text(max_size=20)), st.sampled_from([None, 1.0, float(YEAR_S)]))
def test_verify_sas_token_raises_only_authentication_error(token: str, key: str, lifetime: float | None) -> None:
    try:
        verify_sas_token(token, resource=RESOURCE, key_b64=key, clock=ManualClock(NOW), max_lifetime_s=lifetime)
    except AuthenticationError:
        pass


_cs_pieces = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["HostName=", "DeviceId=", "ModuleId=", "SharedAccessKey=", "GatewayHostName=", ";", "=", "/"]),
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=300), st.lists(_cs_pieces, max_size=14).map("".join)))
def test_connection_string_parse_raises_only_value_error(text: str) -> None:
    try:
        parsed = ConnectionString.parse(text)
    except ValueError:
        return
    assert parsed.identity.device_id == parsed.device_id  # a parsed one always names a valid identity


def test_a_huge_connection_string_is_refused_by_its_length() -> None:
    with pytest.raises(ValueError, match="at most"):
        ConnectionString.parse("HostName=h;DeviceId=d;" + ";" * 1_000_000)


@settings(max_examples=150, deadline=None)
@given(
    password=st.one_of(st.none(), st.binary(max_size=200), _tokens.map(lambda t: t.encode("utf-8", "surrogatepass"))),
    username=st.one_of(st.none(), st.text(max_size=50)),
    thumbprint=st.one_of(st.none(), st.text(max_size=70)),
    cn=st.one_of(st.none(), st.text(max_size=30)),
    device=st.text(min_size=1, max_size=20).filter(lambda d: "/" not in d),
)
def test_hub_authenticate_raises_only_authentication_error(
    password: bytes | None, username: str | None, thumbprint: str | None, cn: str | None, device: str
) -> None:
    import asyncio

    async def attempt() -> None:
        store = Store.in_memory()
        router = Router({"all": "FROM /* INTO $upstream"})
        async with EdgeHub(store=store, router=router, host_name="hub.test", clock=ManualClock(NOW)) as hub:
            known = Identity.parse("dev1")
            await hub.identities.add_symmetric_key(known, KEY)
            await hub.identities.set_thumbprint(known, "ab" * 32)
            for identity in (known, Identity.parse(device)):
                creds = Credentials(identity, username, password, thumbprint, cn, cert_chain_verified=True)
                try:
                    await hub.authenticate(creds)
                except AuthenticationError:
                    pass

    asyncio.run(attempt())


def test_a_device_id_with_a_slash_is_no_device() -> None:
    # Found by the test above: DeviceId=0/0 parsed, and its identity named module 0 of device 0.
    with pytest.raises(ValueError, match="invalid device id"):
        ConnectionString.parse("HostName=h;DeviceId=0/0")
