"""Queue ids: built and parsed here and nowhere else.

A queue is one sequential store per (endpoint, priority). Its name is also its RocksDB column family:
``q:p<priority>:<endpoint>`` (``q:pdefault:<endpoint>`` for DEFAULT_PRIORITY); the endpoint comes last so
that it may hold any character, ``/`` and ``:`` included. A dead-letter queue is ``dlq:<endpoint>``. The endpoint
ids themselves (``$upstream``, its lanes, module inputs) are built and parsed in ``edgehub.core.endpoints``.
"""

from __future__ import annotations

import msgspec

from edgehub.core import DEFAULT_PRIORITY

__all__ = ["QueueId", "dead_letter_name"]

_QUEUE = "q"
_DLQ = "dlq"


# A msgspec Struct: queue ids key the store's and the executors' per-queue dicts on the ingest and delivery
# paths, and a Struct's hash is computed once and kept in C (``cache_hash``). Ordered by (endpoint, priority),
# equal by value, frozen.
class QueueId(msgspec.Struct, frozen=True, order=True, cache_hash=True):
    """One endpoint's queue at one priority (0 highest, DEFAULT_PRIORITY lowest)."""

    endpoint: str
    priority: int

    def __post_init__(self) -> None:
        if not self.endpoint:
            raise ValueError("a queue needs an endpoint id")
        if not 0 <= self.priority <= DEFAULT_PRIORITY:
            raise ValueError(f"priority {self.priority} outside 0..{DEFAULT_PRIORITY}")

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
