"""The MQTT head's refusals in MQTT's words: one table from the refusals of a message (``MESSAGE_REFUSALS`` in
``edgehub.core.refusals``: the hub's ``Rejected`` outcomes, the head's own, and a store that cannot write) to the
reason code of the negative PUBACK an MQTT 5 client gets, and the DISCONNECT of a store failure that ends the
connection. The AMQP head keeps its own table in the same form (``protocol_heads.amqp.refusals``).

Invariants: ``REJECT_REASONS`` maps every reason of ``MESSAGE_REFUSALS`` (a test pins it), so a refusal's code is
chosen here and nowhere else; a 3.1.1 client, which has no negative ack, is disconnected instead
(``ServerConnection.settle_many``).
"""

from __future__ import annotations

from collections.abc import Mapping

from edgehub.core.refusals import RefusalReason
from edgehub.mqtt.packets import ReasonCode

__all__ = ["REJECT_REASONS", "STORE_FAILED"]

# Refusals of a message → MQTT 5 reason codes of the negative PUBACK/PUBREC.
REJECT_REASONS: Mapping[RefusalReason, ReasonCode] = {
    RefusalReason.QUOTA_EXCEEDED: ReasonCode.QUOTA_EXCEEDED,
    # Over maxMessageSizeBytes but within the packet size: 0x95 (Packet too large) is a DISCONNECT's code only, and a
    # PUBACK carrying it is malformed to MQTT 5 clients (paho drops the connection); 0x83 and the Reason String say it.
    RefusalReason.MESSAGE_TOO_LARGE: ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
    RefusalReason.NOT_AUTHORIZED: ReasonCode.NOT_AUTHORIZED,
    RefusalReason.TOPIC_INVALID: ReasonCode.TOPIC_NAME_INVALID,
    RefusalReason.INVALID_MESSAGE: ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
    # sessionId and partitionKey differ: the PUBLISH is well formed but the hub will not take it, which is 0x83's
    # meaning in MQTT 5 (0x99 "payload format invalid" is about the payload format indicator, not properties).
    RefusalReason.PARTITION_KEY_MISMATCH: ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
    # No endpoint its routes name could ever carry it (a property bag over MQTT's topic limit for a module that
    # can only be reached over MQTT): well formed, but the hub will not take it: 0x83 again.
    RefusalReason.UNDELIVERABLE: ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
    # The disk refused the write (full, failing): 0x97 tells the device to hold on to it and retry later.
    RefusalReason.STORE_UNAVAILABLE: ReasonCode.QUOTA_EXCEEDED,
    # Refused with no more specific reason.
    RefusalReason.REJECTED: ReasonCode.UNSPECIFIED_ERROR,
}

# The store failed in a way a retry on this connection cannot mend (closed while the hub stops, broken): the
# DISCONNECT's reason code and Reason String, and no ack for the group.
STORE_FAILED: tuple[ReasonCode, str] = (ReasonCode.UNSPECIFIED_ERROR, "store failure")
