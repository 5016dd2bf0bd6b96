"""Counts and times of the hub's operations (twin GETs and patches, method calls, logins), kept where the work
happens, once per operation, and read by ``/metrics`` at scrape time (``edgehub.runtime.admin.metrics``).

Why not prometheus-client objects: they would be imported and updated on paths that must not pay for metrics
(prometheus-client is imported only at the first scrape), and a hub that is never scraped would carry them. An
``OpStats`` is a dict of plain ``[count, seconds]`` pairs keyed by label values.

Invariants:
* ``add`` is one dict look-up and two additions; nothing here is per message (callers add per operation or per
  batch).
* Memory is bounded: at most ``max_keys`` label tuples are kept; past that, new ones are added under ``OTHER``
  (every label ``"_other"``), so a stream of new identities or reasons cannot grow it.
* Counts only grow (a Prometheus counter must not go back), for the life of the process.

Standard library only, like all of ``edgehub.core``.
"""

from __future__ import annotations

__all__ = ["OTHER", "OpStats"]

OTHER = "_other"


class OpStats:
    """``[count, seconds]`` per label values (``labels`` names them, for the collector)."""

    __slots__ = ("_max_keys", "_tallies", "labels")

    def __init__(self, *labels: str, max_keys: int = 4096) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be positive")
        self.labels = labels
        self._max_keys = max_keys
        self._tallies: dict[tuple[str, ...], list[float]] = {}

    def add(self, *values: str, n: int = 1, seconds: float = 0.0) -> None:
        """Count ``n`` operations under ``values`` (one per label), which took ``seconds`` in all."""
        if len(values) != len(self.labels):
            raise ValueError(f"{len(self.labels)} label values expected, got {len(values)}")
        tally = self._tallies.get(values)
        if tally is None:
            if len(self._tallies) >= self._max_keys:
                values = (OTHER,) * len(self.labels)
            tally = self._tallies.setdefault(values, [0, 0.0])
        tally[0] += n
        tally[1] += seconds

    def items(self) -> list[tuple[tuple[str, ...], int, float]]:
        """(label values, count, seconds) for each label tuple seen, in the order first seen."""
        return [(key, int(count), seconds) for key, (count, seconds) in self._tallies.items()]

    def count(self, *values: str) -> int:
        """The count under ``values`` (0 if none)."""
        tally = self._tallies.get(values)
        return 0 if tally is None else int(tally[0])

    def total(self) -> int:
        return int(sum(count for count, _ in self._tallies.values()))
