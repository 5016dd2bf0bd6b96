"""The MQTT head's settings: what both heads share (``HeadSettings``: listeners, connection caps, the login
throttle, pacing; ``protocol_heads.limits``) and MQTT's own per-connection limits, the bounds that keep a hostile
outside from costing more than they say. Each limit is a keyword field with a safe default, documented on
``MqttSettings``; ``edgehub run`` exposes those an operator needs as flags.

Invariants: a ``MqttSettings`` is valid once built (``__post_init__`` refuses a limit out of range), and
``connection_cap`` never passes what the process's descriptor limit allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from edgehub.core.message_size import MAX_MESSAGE_SIZE_BYTES, WIRE_ENVELOPE_BYTES
from edgehub.mqtt.caches import TOPIC_CACHE_BYTES
from protocol_heads.limits import HeadSettings, connection_cap
from protocol_heads.mqtt.iothub import Acl

__all__ = ["MqttSettings", "connection_cap"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MqttSettings(HeadSettings):
    """Listener and connection settings: ``HeadSettings``' fields, with these of MQTT's own.

    * ``tls_port``: MQTT over TLS, 8883 by default.
    * ``max_subscriptions``: topic filters per connection; more are refused in SUBACK (0x97 quota exceeded).
    * ``max_filter_length``: the longest topic filter, in UTF-8 bytes; longer is refused (0x8F).
    * ``max_topic_length``: the longest PUBLISH topic name, in characters; longer is refused (0x90).
    * ``topic_cache_bytes``: what each of a connection's topic caches (decoder, encoder, telemetry
      properties) may hold.
    * ``not_reading_timeout_s``: how long a client with keepalive 0 may leave its acks unread (write buffer
      over its high-water mark) before it is aborted; with a keepalive, its timeout (1.5x) applies.
    * ``max_packet_size``: the most any packet may be; each connection takes packets up to the deployment's bound
      under it, as it is when the connection is accepted (``read_bound``), announced to MQTT 5 clients in CONNACK;
      over it closes with 0x95.
    * ``receive_maximum``: unacknowledged inbound QoS 1/2 messages allowed per client.
    * ``acl``: who may publish and subscribe where, beyond the IoT Hub defaults.

    A login refused by the throttle gets CONNACK 0x9F (connection rate exceeded; 3.1.1: 0x05).
    """

    descriptors_per_connection: ClassVar[int] = 2  # the socket and its TCP_QUICKACK duplicate (client_socket)
    positive_fields: ClassVar[tuple[str, ...]] = (
        *HeadSettings.positive_fields,
        "max_subscriptions",
        "max_filter_length",
        "max_topic_length",
        "not_reading_timeout_s",
    )

    tls_port: int | None = 8883
    max_subscriptions: int = 64
    max_filter_length: int = 1024
    max_topic_length: int = 4096
    topic_cache_bytes: int = TOPIC_CACHE_BYTES
    not_reading_timeout_s: float = 90.0
    # The hub's hard cap on a message and its framing (edgehub.core.message_size); each connection reads up to the
    # deployment's bound under it (read_bound), and the store holds each message to its routes' limits, live.
    max_packet_size: int = MAX_MESSAGE_SIZE_BYTES + WIRE_ENVELOPE_BYTES
    receive_maximum: int = 1024
    acl: Acl = field(default_factory=Acl)

    def __post_init__(self) -> None:
        HeadSettings.__post_init__(self)  # not super(): a slotted dataclass is a new class, its __class__ cell stale
        if self.topic_cache_bytes < 0:
            raise ValueError("topic_cache_bytes must not be negative")
