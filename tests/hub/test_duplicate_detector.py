"""The duplicate detector's bookkeeping (``edgehub.hub.dedup.DuplicateDetector``) on a manual clock; the durable
window around it is tested over a real store in test_duplicate_window.py."""

from __future__ import annotations

from edgehub.hub.dedup import DuplicateDetector
from edgehub.testing import ManualClock


def test_duplicate_inside_the_window_is_dropped_and_counted_then_forgotten_after_it() -> None:
    clock = ManualClock()
    dd = DuplicateDetector(clock=clock, window_s=600)
    assert not dd.is_duplicate("dev1", "m-1")
    dd.remember("dev1", "m-1")
    clock.advance(599)
    assert dd.is_duplicate("dev1", "m-1")
    assert not dd.is_duplicate("dev2", "m-1")  # another identity's m-1 is another message
    assert dd.duplicates == 1
    clock.advance(1)  # 600 s after the first acceptance: the window has passed
    assert not dd.is_duplicate("dev1", "m-1")
    assert dd.expire() == [("dev1", "m-1")]
    assert len(dd) == 0
    assert dd.duplicates == 1


def test_looking_does_not_remember_so_a_message_that_was_never_stored_is_not_a_duplicate() -> None:
    dd = DuplicateDetector(clock=ManualClock())
    assert not dd.is_duplicate("dev1", "m-1")
    assert not dd.is_duplicate("dev1", "m-1")  # the first copy's store write failed: the retry is new
    assert len(dd) == 0


def test_a_message_without_message_id_is_never_a_duplicate() -> None:
    dd = DuplicateDetector(clock=ManualClock())
    assert not dd.is_duplicate("dev1", None)
    assert not dd.is_duplicate("dev1", "")
    assert len(dd) == 0


def test_duplicate_memory_is_bounded_by_forgetting_the_oldest_and_says_what_it_forgot() -> None:
    dd = DuplicateDetector(clock=ManualClock(), max_entries=2)
    for mid in ("a", "b", "c"):
        dd.remember("d", mid)
    assert len(dd) == 2
    assert dd.expire() == [("d", "a")]
    assert not dd.is_duplicate("d", "a")  # forgotten: let through, never wrongly dropped
    assert dd.is_duplicate("d", "c")


def test_a_remembered_time_from_the_past_expires_by_that_time() -> None:
    clock = ManualClock()
    dd = DuplicateDetector(clock=clock, window_s=600)
    dd.remember("d", "old", at_s=clock.time() - 600)  # reloaded after a restart: already out of the window
    dd.remember("d", "new", at_s=clock.time() - 10)
    assert not dd.is_duplicate("d", "old")
    assert dd.is_duplicate("d", "new")
    assert dd.expire() == [("d", "old")]
