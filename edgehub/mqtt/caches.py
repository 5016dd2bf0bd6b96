"""Per-connection memo dictionaries bounded in bytes, for the topic caches of the codec and the server.

Topics recur (one device, a few topics), so the head remembers what it worked out about each: the decoder the
string of a topic's bytes, the encoder a topic's wire bytes, the server the properties of a telemetry topic.
Counted in entries, such caches were a memory amplifier: 4,096 entries of 64 KB topics are 268 MB, and a
process-wide one let one client fill it for all. A ``BudgetDict`` belongs to one connection and counts the
bytes of what it holds.

Invariants:
* ``used`` never exceeds ``budget`` (bytes as the caller prices an entry); an entry priced over a quarter of
  the budget is not kept at all, so a few huge topics cannot evict every useful one.
* Reads are plain ``dict.get`` (the hot path pays nothing for the bound); only ``remember`` (a miss) counts.
* When an entry would pass the budget, everything is forgotten at once: cheaper than tracking recency, and a
  connection's working set of topics comes back on the next messages.
"""

from __future__ import annotations

from typing import Final, TypeVar

__all__ = ["TOPIC_CACHE_BYTES", "BudgetDict", "topic_cost"]

# Per connection and per topic cache (decoder: topic bytes → str; encoder: topic → wire bytes): 32 KiB holds
# some 100 topics of a device's usual length, and topics of up to ~4 KB.
TOPIC_CACHE_BYTES: Final = 32 * 1024
_ENTRY_OVERHEAD: Final = 128

K = TypeVar("K")
V = TypeVar("V")


class BudgetDict(dict[K, V]):
    """A dict with ``remember(key, value, cost)``: kept while the summed costs fit ``budget`` bytes."""

    __slots__ = ("budget", "used")

    def __init__(self, budget: int) -> None:
        super().__init__()
        if budget < 0:
            raise ValueError("budget must not be negative")
        self.budget = budget
        self.used = 0

    def remember(self, key: K, value: V, cost: int) -> None:
        """Keep ``key`` -> ``value``, priced ``cost`` bytes, unless it is too large to be worth it."""
        if cost * 4 > self.budget:
            return
        if self.used + cost > self.budget:
            self.clear()
        self[key] = value
        self.used += cost

    def clear(self) -> None:
        super().clear()
        self.used = 0


def topic_cost(nbytes: int) -> int:
    """The price of a codec cache entry for a topic of ``nbytes`` UTF-8 bytes: its text twice (key and value)
    plus a dict slot's and two objects' overhead."""
    return _ENTRY_OVERHEAD + 2 * nbytes
