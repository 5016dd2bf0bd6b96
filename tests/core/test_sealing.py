"""``HmacSealer``: a sealed secret opens only with its key and for the identity it was sealed for, and holds no
byte of the secret."""

from __future__ import annotations

import base64
import secrets

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgehub.core import SealedSecretError
from edgehub.core.sealing import HmacSealer

KEY = bytes(range(32))


@given(secret=st.binary(max_size=300), bound_to=st.text(max_size=40))
def test_a_sealed_secret_opens_to_itself(secret: bytes, bound_to: str) -> None:
    sealer = HmacSealer(KEY)
    sealed = sealer.seal(secret, bound_to=bound_to)
    assert sealed.isascii()
    assert sealer.unseal(sealed, bound_to=bound_to) == secret


def test_sealing_twice_gives_two_texts_and_neither_holds_the_secret() -> None:
    sealer, secret = HmacSealer(KEY), secrets.token_bytes(32)
    one, two = sealer.seal(secret, bound_to="dev1"), sealer.seal(secret, bound_to="dev1")
    assert one != two

    for text in (one, two):
        assert base64.b64encode(secret).decode() not in text
        assert secret not in base64.urlsafe_b64decode(text.partition(":")[2])


def test_a_sealed_secret_does_not_open_for_another_identity_another_key_or_once_altered() -> None:
    sealed = HmacSealer(KEY).seal(b"k" * 32, bound_to="dev1")
    with pytest.raises(SealedSecretError):
        HmacSealer(KEY).unseal(sealed, bound_to="dev2")
    with pytest.raises(SealedSecretError):
        HmacSealer(bytes(32)).unseal(sealed, bound_to="dev1")
    flipped = sealed[:-3] + ("A" if sealed[-3] != "A" else "B") + sealed[-2:]
    for damaged in (flipped, sealed[:20], "hs1:!!!", "other:" + sealed, ""):
        with pytest.raises(SealedSecretError):
            HmacSealer(KEY).unseal(damaged, bound_to="dev1")


def test_a_seal_key_is_32_bytes() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        HmacSealer(b"short")
