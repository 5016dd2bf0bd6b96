from __future__ import annotations

import pytest

from edgehub.delivery import Checkpointer


def test_commit_never_moves_past_first_owed_message() -> None:
    cp = Checkpointer(-1)
    cp.propose([0, 1, 2, 3])
    assert cp.commit([0, 2, 3], remaining=[1]) == 0
    assert cp.owed == {1}
    assert cp.commit([1]) == 3


def test_commit_starts_from_the_persisted_offset() -> None:
    cp = Checkpointer(9)
    cp.propose([10, 11])
    assert cp.owed == {10, 11}
    assert cp.commit([11]) == 9
    assert cp.commit([10]) == 11


def test_nothing_done_commits_nothing() -> None:
    cp = Checkpointer(-1)
    cp.propose([0])
    assert cp.commit([], remaining=[0]) == -1


def test_admit_refuses_offsets_already_committed_or_proposed() -> None:
    cp = Checkpointer(9)
    assert not cp.admit(8)
    assert not cp.admit(9)
    assert cp.admit(10)
    cp.propose([10, 11])
    assert not cp.admit(11)  # a stale read of what is already in flight
    assert cp.admit(12)


def test_proposing_an_offset_that_was_not_admitted_is_refused() -> None:
    cp = Checkpointer(9)
    with pytest.raises(ValueError, match="offset 8 was not admitted"):
        cp.propose([8])
    cp.propose([10])
    with pytest.raises(ValueError, match="offset 10 was not admitted"):
        cp.propose([10])
