"""The values built for every message (msgspec Structs, for their C ``__init__``) stay immutable values: equal by
their fields, never assigned to, copied with a change by ``msgspec.structs.replace``."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from edgehub.core import Message
from edgehub.core.refusals import RefusalReason
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.hub import Delivery, Rejected, Stored
from edgehub.mqtt.packets import PubAck, Publish
from edgehub.store import QueueId
from edgehub.store.records import EnqueueReceipt, Reference, StoredItem
from protocol_heads.mqtt.connection import DeliveryAcked, MessageReceived

MSG = Message(b"x", {"a": "1"})
Q = QueueId("ep", 1)
VALUES: list[Any] = [
    QueuedMessage(MSG, 3, 1, 10.0, 5.0),
    Stored("e1"),
    Rejected(RefusalReason.QUOTA_EXCEEDED, "full"),
    Delivery(7, MSG, "in"),
    StoredItem(Q, 3, MSG, 9, 10.0, 5.0, 12),
    Reference(3, 9, 10.0, 5.0, 12),
    EnqueueReceipt(MSG, ((Q, 3),)),
    Publish("t", b"p", qos=1, packet_id=4),
    PubAck(4),
    MessageReceived(Publish("t"), 2),
    DeliveryAcked(4, 0),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_a_hot_value_is_an_immutable_value(value: Any) -> None:
    fields = msgspec.structs.asdict(value)
    twin = type(value)(**fields)
    assert twin == value
    assert twin is not value
    name = next(iter(fields))
    with pytest.raises(AttributeError):
        setattr(value, name, fields[name])
    changed = msgspec.structs.replace(value, **{name: None})
    assert getattr(changed, name) is None
    assert getattr(value, name) == fields[name]
    assert changed != value
