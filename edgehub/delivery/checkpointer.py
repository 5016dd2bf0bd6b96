"""Per-queue checkpointer: which offsets are owed, and how far the queue may be committed.

``admit(offset)`` says whether a read reference is new to the queue (above everything committed or proposed so
far); the executor drops what is not admitted (a stale prefetch, a reference read twice). ``propose(offsets)``
registers admitted offsets, in queue order, as handed to a send; proposing one that was not admitted is a bug
and raises ``ValueError``. ``commit(successful, remaining)`` marks the first done (delivered, expired, removed
or dead-lettered) and keeps the second owed.

Invariants: ``commit`` never moves the committed offset past the first offset still owed, so a restart
redelivers everything not acknowledged; an offset is proposed at most once.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Checkpointer"]


class Checkpointer:
    def __init__(self, committed: int = -1) -> None:
        self._committed = committed
        self._proposed = committed  # the highest offset proposed so far (or the committed one)
        self._owed: set[int] = set()
        self._done: set[int] = set()

    def admit(self, offset: int) -> bool:
        """Whether ``offset`` is new: above the committed offset and above every offset proposed so far."""
        return offset > self._proposed

    def propose(self, offsets: Iterable[int]) -> None:
        """Register admitted offsets, in increasing order, as owed until committed."""
        for o in offsets:
            if not self.admit(o):
                raise ValueError(f"offset {o} was not admitted: proposed up to {self._proposed}")
            self._owed.add(o)
            self._proposed = o

    def commit(self, successful: Iterable[int], remaining: Iterable[int] = ()) -> int:
        """Mark ``successful`` done; ``remaining`` stay owed. Returns the offset that may now be committed."""
        for o in successful:
            self._owed.discard(o)
            if o > self._committed:
                self._done.add(o)
        self._owed.update(o for o in remaining if o > self._committed)
        limit = min(self._owed) - 1 if self._owed else max(self._done, default=self._committed)
        advanced = sorted([o for o in self._done if o <= limit])
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
