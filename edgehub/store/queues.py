"""Queue ids: built and parsed here and nowhere else.

A queue is one sequential store per (endpoint, priority). Its name is also its RocksDB column family:
``q:p<priority>:<endpoint>`` (``q:pdefault:<endpoint>`` for DEFAULT_PRIORITY); the endpoint comes last so
that it may hold any character, ``/`` and ``:`` included. A dead-letter queue is ``dlq:<endpoint>``.
"""

from __future__ import annotations

import msgspec

from edgehub.core import DEFAULT_PRIORITY

__all__ = [
    "UPSTREAM_ENDPOINT",
    "QueueId",
    "dead_letter_name",
    "is_upstream_endpoint",
    "parse_upstream_lane_id",
    "upstream_lane_id",
]

_QUEUE = "q"
_DLQ = "dlq"


# A msgspec Struct, not a dataclass: queue ids key the store's and the executors' per-queue dicts on the ingest
# and delivery paths (six to nine look-ups per message), and a Struct's hash is computed once and kept in C
# (``cache_hash``), where a dataclass's was a Python ``__hash__`` call every time. Ordered by (endpoint,
# priority), equal by value, frozen, as the dataclass was.
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


# -- upstream lanes (issue 5) -----------------------------------------------------------------------------------
# With ``partitions: N`` > 1 the upstream is N lanes, each its own endpoint (so its own queues, checkpoints and
# executor): ``$upstream/0`` … ``$upstream/{N-1}``. With one partition the lane is ``$upstream`` itself, so a hub
# that never turned partitions on keeps its queues. Built and parsed here, next to the queue ids, and nowhere else.

UPSTREAM_ENDPOINT = "$upstream"


def upstream_lane_id(partition: int, partitions: int) -> str:
    """The endpoint id of lane ``partition`` of ``partitions``: ``$upstream`` for one lane, else ``$upstream/{i}``."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} out of range 0..{partitions - 1}")
    return UPSTREAM_ENDPOINT if partitions == 1 else f"{UPSTREAM_ENDPOINT}/{partition}"


def parse_upstream_lane_id(endpoint: str) -> int | None:
    """The partition of a lane endpoint id (``$upstream/3`` → 3); None for ``$upstream`` and for any other id."""
    prefix = UPSTREAM_ENDPOINT + "/"
    if not endpoint.startswith(prefix):
        return None
    digits = endpoint[len(prefix) :]
    if not digits.isdigit() or (digits != "0" and digits.startswith("0")):
        return None
    return int(digits)


def is_upstream_endpoint(endpoint: str) -> bool:
    """``$upstream`` or one of its lanes."""
    return endpoint == UPSTREAM_ENDPOINT or parse_upstream_lane_id(endpoint) is not None
