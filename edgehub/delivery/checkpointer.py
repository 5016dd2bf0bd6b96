"""Per-queue checkpointer: which offsets are owed, and how far the queue may be committed.

``propose(offsets)`` registers offsets handed to a send; ``commit(successful, remaining)`` marks the first done
(delivered, expired or dead-lettered) and keeps the second owed. Invariant: ``committable`` never moves past the
first offset still owed, so a restart redelivers everything not acknowledged.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Checkpointer"]


class Checkpointer:
    def __init__(self, committed: int = -1) -> None:
        self._committed = committed
        self._owed: set[int] = set()
        self._done: set[int] = set()

    def propose(self, offsets: Iterable[int]) -> None:
        for o in offsets:
            if o > self._committed:
                self._owed.add(o)

    def commit(self, successful: Iterable[int], remaining: Iterable[int] = ()) -> int:
        """Mark ``successful`` done; ``remaining`` stay owed. Returns the offset that may now be committed."""
        for o in successful:
            self._owed.discard(o)
            if o > self._committed:
                self._done.add(o)
        self._owed.update(o for o in remaining if o > self._committed)
        limit = min(self._owed) - 1 if self._owed else max(self._done, default=self._committed)
        advanced = sorted(o for o in self._done if o <= limit)
        if advanced:
            self._committed = max(self._committed, advanced[-1])
            self._done.difference_update(advanced)
        return self._committed

    @property
    def committed(self) -> int:
        return self._committed

    @property
    def owed(self) -> frozenset[int]:
        return frozenset(self._owed)
