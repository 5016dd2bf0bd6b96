"""The store's cache of written messages: references written since they were last delivered, with their
messages, so that an executor that keeps up reads them without a database read and decode.

Items are added when their group write succeeded, dropped when committed or removed. Each queue's items live in
its ``QueueState.held``; this part bounds them all together.

Invariants:
* at most ``MAX_ITEMS`` items and ``MAX_BYTES`` charged bytes are held over all queues (past that, new ones are
  read from the database);
* an item is charged at least what it takes in memory: its charged size (the text of its body and properties)
  plus ``ITEM_BYTES`` and ``PROPERTY_BYTES`` per property, measured with tracemalloc
  (tests/store/test_held_memory.py: ~110 bytes for the StoredItem, the Message and its dicts, ~120 per property
  whose strings are the message's own) with a margin;
* mutated on the event loop only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from edgehub.store.queue_state import QueueState
from edgehub.store.queues import QueueId
from edgehub.store.records import StoredItem

__all__ = ["HeldCache"]

MAX_ITEMS = 16384
MAX_BYTES = 16 << 20
ITEM_BYTES = 256
PROPERTY_BYTES = 128


def held_bytes(item: StoredItem) -> int:
    """What holding ``item`` in memory is charged (at least what it takes)."""
    m = item.message
    return item.size_bytes + ITEM_BYTES + PROPERTY_BYTES * (len(m.properties) + len(m.system_properties))


class HeldCache:
    __slots__ = ("bytes", "count")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0

    def remember(self, queues: Mapping[QueueId, QueueState], items: Iterable[StoredItem]) -> None:
        """Hold these just-written items while the bounds allow (in order: the first that does not fit ends it)."""
        count, size = self.count, self.bytes
        if count >= MAX_ITEMS or size >= MAX_BYTES:
            return
        for item in items:
            charge = held_bytes(item)
            if count >= MAX_ITEMS or size + charge > MAX_BYTES:
                break
            queues[item.queue].held[item.offset] = item
            count += 1
            size += charge
        self.count, self.bytes = count, size

    def forget(self, state: QueueState, offsets: Iterable[int]) -> None:
        held = state.held
        if held:
            for off in offsets:
                item = held.pop(off, None)
                if item is not None:
                    self.count -= 1
                    self.bytes -= held_bytes(item)

    @staticmethod
    def upto(state: QueueState, offset: int) -> list[StoredItem]:
        """The held items of the queue at or below ``offset``, in offset order."""
        held = state.held
        if not held:
            return []
        out: list[StoredItem] = []
        for item in held.values():  # offset order
            if item.offset > offset:
                break
            out.append(item)
        return out
