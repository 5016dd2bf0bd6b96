"""``OpStats``: counts and times per label values, bounded in keys whatever the values are."""

from __future__ import annotations

import pytest

from edgehub.core.opstats import OTHER, OpStats


def test_counts_and_seconds_add_up_per_label_values() -> None:
    stats = OpStats("from", "to")
    stats.add("a", "b", seconds=0.5)
    stats.add("a", "b", n=2, seconds=0.25)
    stats.add("c", "b")
    assert stats.items() == [(("a", "b"), 3, 0.75), (("c", "b"), 1, 0.0)]
    assert (stats.count("a", "b"), stats.count("x", "y"), stats.total()) == (3, 0, 4)


def test_label_values_past_max_keys_are_counted_under_other() -> None:
    stats = OpStats("id", max_keys=2)
    for i in range(100):
        stats.add(f"client{i}")
    stats.add("client0")  # a key kept before the bound still counts under its own name
    assert [key for key, _, _ in stats.items()] == [("client0",), ("client1",), (OTHER,)]
    assert stats.count("client0") == 2
    assert stats.count(OTHER) == 98
    assert stats.total() == 101


def test_a_wrong_number_of_label_values_is_refused() -> None:
    stats = OpStats("reason")
    with pytest.raises(ValueError, match="1 label values expected, got 2"):
        stats.add("a", "b")
    with pytest.raises(ValueError, match="max_keys"):
        OpStats("id", max_keys=0)
