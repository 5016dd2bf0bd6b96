"""The chaos schedule (``bench.chaos.schedule``): one seed, one schedule; kills and outages where they may be."""

from __future__ import annotations

import pytest

from bench.chaos.schedule import EventKind, make_schedule


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert make_schedule(7, 120) == make_schedule(7, 120)
    assert make_schedule(7, 120) != make_schedule(8, 120)


@pytest.mark.parametrize(("seed", "duration_s"), [(s, d) for s in range(20) for d in (30.0, 120.0, 600.0)])
def test_kills_and_outages_stay_inside_the_run_and_outages_never_overlap(seed: int, duration_s: float) -> None:
    events = make_schedule(seed, duration_s)
    assert [e.at_s for e in events] == sorted(e.at_s for e in events)
    assert all(0 <= e.at_s < duration_s for e in events)
    assert sum(e.kind is EventKind.KILL for e in events) >= max(2, round(duration_s / 40))
    down = False
    for e in events:
        if e.kind in (EventKind.SILENT, EventKind.CUT):
            assert not down
            down = True
        elif e.kind is EventKind.RESTORE:
            assert down
            down = False
    assert not down  # the run ends with the link up


def test_a_run_shorter_than_thirty_seconds_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 30 s"):
        make_schedule(1, 29)
