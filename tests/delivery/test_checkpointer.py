from __future__ import annotations

from edgehub.delivery import Checkpointer


def test_commit_never_moves_past_first_owed_message() -> None:
    cp = Checkpointer(-1)
    cp.propose([0, 1, 2, 3])
    assert cp.commit([0, 2, 3], remaining=[1]) == 0
    assert cp.owed == {1}
    assert cp.commit([1]) == 3


def test_commit_starts_from_the_persisted_offset() -> None:
    cp = Checkpointer(9)
    cp.propose([8, 10, 11])
    assert cp.owed == {10, 11}
    assert cp.commit([11]) == 9
    assert cp.commit([10]) == 11


def test_nothing_done_commits_nothing() -> None:
    cp = Checkpointer(-1)
    cp.propose([0])
    assert cp.commit([], remaining=[0]) == -1
