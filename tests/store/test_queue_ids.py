from __future__ import annotations

import pytest

from edgehub.core import DEFAULT_PRIORITY
from edgehub.store import QueueId


@pytest.mark.parametrize(
    ("endpoint", "priority"),
    [("$upstream", 0), ("$upstream/3", 5), ("/modules/m/inputs/i", 9), ("a:b:c", DEFAULT_PRIORITY)],
)
def test_queue_id_name_round_trips(endpoint: str, priority: int) -> None:
    q = QueueId(endpoint, priority)
    assert QueueId.parse(q.name) == q


def test_default_priority_queue_is_named_pdefault() -> None:
    assert QueueId("up", DEFAULT_PRIORITY).name == "q:pdefault:up"


@pytest.mark.parametrize("name", ["messages", "q:x:up", "q:p1:", "dlq:up", "q:p1"])
def test_parse_refuses_names_that_are_not_queues(name: str) -> None:
    with pytest.raises(ValueError):
        QueueId.parse(name)


def test_priority_outside_range_is_refused() -> None:
    with pytest.raises(ValueError):
        QueueId("up", 11)
