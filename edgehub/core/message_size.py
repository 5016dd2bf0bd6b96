"""The one hard cap on a message's size, which the manifest, the store and both protocol heads share.

A deployment sets ``maxMessageSizeBytes`` (the hub's ``delivery.queuePolicy`` and each endpoint's) anywhere from 1
byte to ``MAX_MESSAGE_SIZE_BYTES``; above it the manifest is refused, naming the key's path, and ``QueuePolicy``
refuses it too. The store refuses a message over the strictest routed endpoint's limit, live, as deployments
change it; the heads take a message (AMQP) or a packet (MQTT) up to the cap plus what their framing adds around
it (``WIRE_ENVELOPE_BYTES``) and close on more: so a limit the deployment raises up to the cap is honoured without a
restart, and nothing larger is ever read into memory.

The cap is 1 MiB: four times IoT Hub's 256 KB (a device written for IoT Hub never sends more), and the most an
executor's batch (256 messages) may hold is then 256 MiB; what is larger belongs in a file upload, not a message.
"""

from __future__ import annotations

__all__ = ["MAX_MESSAGE_SIZE_BYTES", "WIRE_ENVELOPE_BYTES", "check_max_message_size"]

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
