"""The one MQTT variable byte integer: the length the upstream counts is the length the head encodes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgehub.core import LocalProtocolError
from edgehub.mqtt.varint import MAX_VARINT, encode_varint, varint_len


@pytest.mark.parametrize("value", [0, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, MAX_VARINT])
def test_the_length_changes_exactly_at_the_boundaries(value: int) -> None:
    assert varint_len(value) == len(encode_varint(value))


@given(st.integers(min_value=0, max_value=MAX_VARINT))
def test_varint_len_is_the_encoded_length(value: int) -> None:
    assert varint_len(value) == len(encode_varint(value))


@pytest.mark.parametrize("value", [-1, MAX_VARINT + 1])
def test_out_of_range_is_our_bug(value: int) -> None:
    with pytest.raises(LocalProtocolError):
        encode_varint(value)
    with pytest.raises(LocalProtocolError):
        varint_len(value)
