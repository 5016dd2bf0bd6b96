"""Queued messages as the hub hands them to an upstream transport, and what each must look like in bronze.

The expectations are stated from the message (its body, properties, system properties, priority, TTL, enqueue
time), not from the segment encoder, so a test using them checks the whole way from a ``QueuedMessage`` to a
bronze row.
"""

from __future__ import annotations

from typing import Any

from edgehub.core import Message, SystemProperty
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.upstream.segment import SEGMENT_FORMAT_VERSION, format_enqueued_at

BASE_S = 1_795_000_020.0  # 2026-11-18T11:07:00Z


def queued_messages(first: int, count: int, *, priority: int) -> list[QueuedMessage]:
    """``count`` messages at offsets ``first``..., varied: binary, text and JSON bodies, a null property, a module,
    some with the hub's edge id and some without (the transport then derives one from the queue position)."""
    out = []
    for offset in range(first, first + count):
        system: dict[str, str] = {
            SystemProperty.MESSAGE_ID: f"m-{offset}",
            SystemProperty.CONNECTION_DEVICE_ID: f"dev{offset % 3}",
            SystemProperty.CONTENT_TYPE: "application/json",
        }
        if offset % 2:
            system[SystemProperty.CONNECTION_MODULE_ID] = "sensor"
            system[SystemProperty.OUTPUT_NAME] = "out1"
        if offset % 4 != 3:
            system[SystemProperty.EDGE_MESSAGE_ID] = f"edge-{offset:06d}"
        # Each v2 body form: binary (body_b64), compact JSON (body_json), spaced JSON and text (body_text).
        body = {
            4: bytes(range(256)),
            2: b'{"temp":%d.5,"unit":"\xc2\xb0C","tags":["a",null]}' % offset,
            1: "plain çødé \u2028 text".encode(),
        }.get(offset % 5, b'{"temp": %d.5, "unit": "C"}' % offset)
        msg = Message(
            body=body, properties={"alert": "yes" if offset % 2 else "no", "empty": None}, system_properties=system
        )
        out.append(
            QueuedMessage(
                message=msg,
                offset=offset,
                priority=priority,
                enqueued_at_s=BASE_S + offset * 0.125,
                ttl_s=3600.0 if priority else 60.5,
            )
        )
    return out


def expected_edge_message_id(qm: QueuedMessage, *, hub_id: str, lane: str) -> str:
    """The hub's id, or the documented fallback ``{hub}.{lane}.{priority}.{offset}``."""
    return qm.message.edge_message_id or f"{hub_id}.{lane}.{qm.priority}.{qm.offset}"


def assert_bronze_row_carries(row: Any, qm: QueuedMessage, *, hub_id: str, lane: str) -> None:
    """Every field of the message is in its bronze row, with its type."""
    m = qm.message
    sp = m.system_properties
    assert row.v == SEGMENT_FORMAT_VERSION
    assert row.edge_message_id == expected_edge_message_id(qm, hub_id=hub_id, lane=lane)
    assert row.hub_id == hub_id
    assert row.message_id == sp.get(SystemProperty.MESSAGE_ID)
    assert row.device_id == sp.get(SystemProperty.CONNECTION_DEVICE_ID)
    assert row.module_id == sp.get(SystemProperty.CONNECTION_MODULE_ID)
    assert format_enqueued_at(row.enqueued_at.timestamp()) == format_enqueued_at(qm.enqueued_at_s)
    assert row.priority == qm.priority
    assert row.ttl_s == qm.ttl_s
    assert row.source == m.source
    assert row.properties == dict(m.properties)
    assert row.system_properties == dict(sp)
    assert bytes(row.body) == m.body
    assert str(row.ingest_date) == row.ingest_at.date().isoformat()
