"""The one table of IoT Hub system properties as property-bag keys (``$.mid``, ``$.ct``, ...).

MQTT carries a message's system properties in the topic's property bag (and, on MQTT 5, in user properties of
the same names); the MQTT head reads them with this table, and the upstream's message mode writes them with it,
so that what a child hub sends a parent is what a device would have sent. The AMQP head maps the same
``SystemProperty`` names to AMQP's own fields.

Invariants:
* ``BAG_KEYS`` and ``KEY_OF`` are inverse: each system property has exactly one bag key.
* ``$.sid`` and ``$.pk`` are not IoT Hub's: they carry Service Bus's SessionId and PartitionKey for partitioned
  upstreams (docs/upstream.md, "Partitions and duplicates").
"""

from __future__ import annotations

from collections.abc import Mapping

from edgehub.core.message import SystemProperty

__all__ = ["BAG_KEYS", "KEY_OF"]

BAG_KEYS: Mapping[str, SystemProperty] = {
    "$.mid": SystemProperty.MESSAGE_ID,
    "$.cid": SystemProperty.CORRELATION_ID,
    "$.ct": SystemProperty.CONTENT_TYPE,
    "$.ce": SystemProperty.CONTENT_ENCODING,
    "$.to": SystemProperty.TO,
    "$.uid": SystemProperty.USER_ID,
    "$.exp": SystemProperty.ABSOLUTE_EXPIRY_TIME,
    "$.schema": SystemProperty.MESSAGE_SCHEMA,
    "$.ctime": SystemProperty.CREATION_TIME,
    "$.on": SystemProperty.OUTPUT_NAME,
    "$.cdid": SystemProperty.CONNECTION_DEVICE_ID,
    "$.cmid": SystemProperty.CONNECTION_MODULE_ID,
    # Plug and Play and security messages: the Azure device SDKs send these (the Python SDK's
    # ``set_as_security_message`` puts ``$.ifid`` in the bag), and IoT Hub files them as system properties.
    "$.ifid": SystemProperty.INTERFACE_ID,
    "$.sub": SystemProperty.DT_SUBJECT,
    "$.sid": SystemProperty.SESSION_ID,
    "$.pk": SystemProperty.PARTITION_KEY,
}

KEY_OF: Mapping[SystemProperty, str] = {name: key for key, name in BAG_KEYS.items()}
