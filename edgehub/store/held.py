"""The store's cache of written messages: references written since they were last delivered, with their
messages, so that an executor that keeps up reads them without a database read and decode.

Items are added when their group write succeeded, dropped when committed or removed. Each queue's items live in
its ``QueueState.held``; this part bounds them all together.

Invariants:
* at most ``max_items`` items and ``max_bytes`` charged bytes (default ``MAX_ITEMS``, ``MAX_BYTES``; a hardware
  profile lowers them on a small board) are held over all queues (past that, new ones are
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
    __slots__ = ("bytes", "count", "max_bytes", "max_items")

    def __init__(self, *, max_items: int = MAX_ITEMS, max_bytes: int = MAX_BYTES) -> None:
        if max_items < 0 or max_bytes < 0:
            raise ValueError("max_items and max_bytes must be >= 0 (0: hold nothing)")
        self.count = 0
        self.bytes = 0
        self.max_items = max_items
        self.max_bytes = max_bytes

    def remember(self, queues: Mapping[QueueId, QueueState], items: Iterable[StoredItem]) -> None:
        """Hold these just-written items while the bounds allow (in order: the first that does not fit ends it)."""
        count, size, max_items, max_bytes = self.count, self.bytes, self.max_items, self.max_bytes
        if count >= max_items or size >= max_bytes:
            return
        for item in items:
            charge = held_bytes(item)
            if count >= max_items or size + charge > max_bytes:
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
