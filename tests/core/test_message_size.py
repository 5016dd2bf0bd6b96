"""What a head reads of one packet or message (``read_bound_bytes``): the largest limit any endpoint has, or a
direct method's response if that is more, and the framing around it; a limit out of range is misuse."""

from __future__ import annotations

import pytest

from edgehub.core.message_size import (
    MAX_MESSAGE_SIZE_BYTES,
    WIRE_ENVELOPE_BYTES,
    check_max_message_size,
    read_bound_bytes,
)
from edgehub.core.methods import MAX_METHOD_PAYLOAD_BYTES


def test_the_bound_is_the_largest_limit_and_the_framing() -> None:
    assert read_bound_bytes(256 * 1024) == 256 * 1024 + WIRE_ENVELOPE_BYTES
    assert read_bound_bytes(MAX_MESSAGE_SIZE_BYTES) == MAX_MESSAGE_SIZE_BYTES + WIRE_ENVELOPE_BYTES  # the cap


def test_a_method_response_is_read_whatever_the_message_limit() -> None:
    # A device answers a 128 KB direct method call even where the deployment takes only small messages.
    assert read_bound_bytes(1) == MAX_METHOD_PAYLOAD_BYTES + WIRE_ENVELOPE_BYTES
    assert read_bound_bytes(MAX_METHOD_PAYLOAD_BYTES + 1) == MAX_METHOD_PAYLOAD_BYTES + 1 + WIRE_ENVELOPE_BYTES


@pytest.mark.parametrize("size", [0, -1, MAX_MESSAGE_SIZE_BYTES + 1])
def test_a_limit_a_message_size_may_not_be_set_to_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="a message size limit is 1 to 1048576 bytes"):
        read_bound_bytes(size)
    with pytest.raises(ValueError, match="a message size limit is 1 to 1048576 bytes"):
        check_max_message_size(size)
