"""The AMQP head's refusals in AMQP's words: one table from the refusals of a message (``MESSAGE_REFUSALS`` in
``edgehub.core.refusals``: the hub's ``Rejected`` outcomes, the head's own, and a store that cannot write) to the
error condition of the ``rejected`` outcome a transfer is settled with, and the close of a store failure that ends
the connection. The MQTT head keeps its own table in the same form (``protocol_heads.mqtt.refusals``).

Invariants: ``REJECT_CONDITIONS`` maps every reason of ``MESSAGE_REFUSALS`` (a test pins it), so a refusal's
condition is chosen here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgehub.core.refusals import RefusalReason

__all__ = ["REJECT_CONDITIONS", "STORE_FAILED", "UNDECODABLE", "rejection_condition"]

# Refusals of a message → the error condition of its ``rejected`` outcome.
REJECT_CONDITIONS: Mapping[RefusalReason, str] = {
    RefusalReason.QUOTA_EXCEEDED: "amqp:resource-limit-exceeded",
    # The disk refused the write (full, failing): a resource the client may find again later.
    RefusalReason.STORE_UNAVAILABLE: "amqp:resource-limit-exceeded",
    RefusalReason.MESSAGE_TOO_LARGE: "amqp:link:message-size-exceeded",
    RefusalReason.NOT_AUTHORIZED: "amqp:unauthorized-access",
    # A message the hub will not take as it stands (its properties, its topic, no more specific reason).
    RefusalReason.INVALID_MESSAGE: "amqp:not-allowed",
    RefusalReason.PARTITION_KEY_MISMATCH: "amqp:not-allowed",
    RefusalReason.TOPIC_INVALID: "amqp:not-allowed",
    RefusalReason.REJECTED: "amqp:not-allowed",
    RefusalReason.UNDELIVERABLE: "amqp:not-allowed",
}

# A transfer the head cannot turn into a message at all (not an AMQP message, or properties IoT Hub does not
# take): refused before it reaches the hub, with the decoder's words.
UNDECODABLE = "amqp:decode-error"

# The store failed in a way a retry on this connection cannot mend (closed while the hub stops, broken): the
# connection's close condition and description, and no settlement for the group.
STORE_FAILED: tuple[str, str] = ("amqp:internal-error", "store failure")


def rejection_condition(reason: RefusalReason) -> str:
    """The error condition of a ``rejected`` outcome for ``reason``."""
    return REJECT_CONDITIONS.get(reason, "amqp:not-allowed")
