"""The one hard cap on a message's size, which the manifest, the store and both protocol heads share.

A deployment sets ``maxMessageSizeBytes`` (the hub's ``delivery.queuePolicy`` and each endpoint's) anywhere from 1
byte to ``MAX_MESSAGE_SIZE_BYTES``; above it the manifest is refused, naming the key's path, and ``QueuePolicy``
refuses it too. The store refuses a message over the strictest routed endpoint's limit, live, as deployments
change it. The heads cannot know where a message will be routed before they have read it, so they read up to
``read_bound_bytes`` of the largest limit any endpoint has (the hub's or an endpoint's, whichever is larger: the
store computes it, ``Store.largest_message_size_bytes``): that limit, or a direct method's response
(``MAX_METHOD_PAYLOAD_BYTES``, which a client sends whatever the message limit) if it is larger, plus what their
framing adds around it (``WIRE_ENVELOPE_BYTES``), and never more than the cap plus that framing. Over it the MQTT
head closes the connection (DISCONNECT 0x95) from the packet's fixed header, and the AMQP head, within a frame of
the bound, drops the rest of the transfer as it comes and then closes its link
(``amqp:link:message-size-exceeded``): neither reads it whole. So a head never refuses what the store would take,
and no connection holds more of a message than the deployment allows.

Live: an MQTT connection takes the bound current when it is accepted (and announces it in an MQTT 5 CONNACK as the
Maximum Packet Size), an AMQP link when it is attached (its ``max-message-size``), and keeps it: a raised limit
reaches a client at its next connection (or link); a lowered one applies at once, through the store's refusal.

The cap is 1 MiB: four times IoT Hub's 256 KB (a device written for IoT Hub never sends more), and the most an
executor's batch (256 messages) may hold is then 256 MiB; what is larger belongs in a file upload, not a message.
"""

from __future__ import annotations

from edgehub.core.methods import MAX_METHOD_PAYLOAD_BYTES

__all__ = ["MAX_MESSAGE_SIZE_BYTES", "WIRE_ENVELOPE_BYTES", "check_max_message_size", "read_bound_bytes"]

MAX_MESSAGE_SIZE_BYTES = 1_048_576
# What a head's framing may add to a message at the cap: MQTT's fixed header, packet id, topic (the heads take
# topics of up to 4 KiB) and MQTT 5 properties; AMQP's header, annotations and properties sections.
WIRE_ENVELOPE_BYTES = 8 * 1024


def check_max_message_size(size_bytes: int) -> int:
    """``size_bytes`` if it is a limit a message size may be set to (1 to ``MAX_MESSAGE_SIZE_BYTES``); else
    ``ValueError`` saying the bounds."""
    if not 1 <= size_bytes <= MAX_MESSAGE_SIZE_BYTES:
        raise ValueError(f"a message size limit is 1 to {MAX_MESSAGE_SIZE_BYTES} bytes, not {size_bytes}")
    return size_bytes


def read_bound_bytes(largest_message_size_bytes: int) -> int:
    """What a head reads of one packet (MQTT) or message (AMQP) while the largest ``maxMessageSizeBytes`` any
    endpoint has is ``largest_message_size_bytes``: that, or a direct method's largest response if it is more,
    plus ``WIRE_ENVELOPE_BYTES``; ``ValueError`` for a limit a message size may not be set to."""
    return max(check_max_message_size(largest_message_size_bytes), MAX_METHOD_PAYLOAD_BYTES) + WIRE_ENVELOPE_BYTES
