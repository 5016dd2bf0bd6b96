"""Queue ids: built and parsed here and nowhere else.

A queue is one sequential store per (endpoint, priority). Its name is also its RocksDB column family:
``q:p<priority>:<endpoint>`` (``q:pdefault:<endpoint>`` for DEFAULT_PRIORITY); the endpoint comes last so
that it may hold any character, ``/`` and ``:`` included. A dead-letter queue is ``dlq:<endpoint>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgehub.core import DEFAULT_PRIORITY

__all__ = ["QueueId", "dead_letter_name"]

_QUEUE = "q"
_DLQ = "dlq"


@dataclass(frozen=True, slots=True, order=True)
class QueueId:
    """One endpoint's queue at one priority (0 highest, DEFAULT_PRIORITY lowest)."""

    endpoint: str
    priority: int
    # Queue ids key the store's per-queue dicts on the ingest path (~9 lookups per reference): the hash is made
    # once, not by the generated __hash__ building a tuple each time.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.endpoint:
            raise ValueError("a queue needs an endpoint id")
        if not 0 <= self.priority <= DEFAULT_PRIORITY:
            raise ValueError(f"priority {self.priority} outside 0..{DEFAULT_PRIORITY}")
        object.__setattr__(self, "_hash", hash((self.endpoint, self.priority)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def name(self) -> str:
        tag = "pdefault" if self.priority == DEFAULT_PRIORITY else f"p{self.priority}"
        return f"{_QUEUE}:{tag}:{self.endpoint}"

    @classmethod
    def parse(cls, name: str) -> QueueId:
        kind, tag, endpoint = [*name.split(":", 2), "", ""][:3]
        if kind != _QUEUE or not tag.startswith("p") or not endpoint:
            raise ValueError(f"not a queue name: {name!r}")
        digits = tag[1:]
        if digits == "default":
            return cls(endpoint, DEFAULT_PRIORITY)
        if not digits.isdigit():
            raise ValueError(f"not a queue name: {name!r}")
        return cls(endpoint, int(digits))

    @staticmethod
    def is_queue_name(name: str) -> bool:
        return name.startswith(_QUEUE + ":")

    def __str__(self) -> str:
        return self.name


def dead_letter_name(endpoint: str) -> str:
    """The column family of an endpoint's dead-letter queue."""
    if not endpoint:
        raise ValueError("a dead-letter queue needs an endpoint id")
    return f"{_DLQ}:{endpoint}"
