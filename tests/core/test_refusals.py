"""RefusalLog: every refusal is counted, a peer's lines are capped per window, what was held back is said."""

from __future__ import annotations

import logging

import pytest

from edgehub.core.refusals import RateLimitedLog, RefusalLog, RefusalReason
from edgehub.testing import ManualClock


def test_a_peer_logs_its_burst_then_is_held_back_until_the_window_passes(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    refusals = RefusalLog(logging.getLogger("t.refusals"), burst=3, window_s=10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="t.refusals"):
        logged = [refusals.refused(RefusalReason.BAD_CREDENTIALS, peer="1.2.3.4:5", client="dev1") for _ in range(10)]
        assert logged == [True] * 3 + [False] * 7
        assert refusals.refused(RefusalReason.NOT_AUTHORIZED, peer="other:1")  # another peer has its own lines
        clock.advance(10.0)
        assert refusals.refused(RefusalReason.BAD_CREDENTIALS, peer="1.2.3.4:5", client="dev1", detail="expired")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5
    assert lines[0] == "refused reason=bad_credentials peer=1.2.3.4:5 client=dev1"
    assert lines[3] == "refused reason=not_authorized peer=other:1 client=-"
    assert lines[4] == "refused reason=bad_credentials peer=1.2.3.4:5 client=dev1 detail=expired suppressed=7"
    assert all(r.levelno == logging.INFO for r in caplog.records)
    assert (refusals.total, refusals.suppressed) == (12, 7)


def test_the_peers_it_remembers_are_bounded() -> None:
    refusals = RefusalLog(logging.getLogger("t.refusals.bound"), burst=1, max_peers=100, clock=ManualClock())
    for i in range(1_000):
        refusals.refused(RefusalReason.MALFORMED_PACKET, peer=f"10.0.0.{i}")
    assert len(refusals._peers) == 100
    # The oldest were forgotten: the first peer may log again.
    assert refusals.refused(RefusalReason.MALFORMED_PACKET, peer="10.0.0.0")


def test_bad_settings_are_misuse() -> None:
    with pytest.raises(ValueError, match="positive"):
        RefusalLog(logging.getLogger("t"), burst=0)


def test_any_line_an_outside_party_causes_is_held_back_per_peer_like_a_refusal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    events = RateLimitedLog(logging.getLogger("t.events"), burst=2, window_s=10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="t.events"):
        logged = [events.line("dev1", "mqtt.connected", client="dev1", level=4) for _ in range(5)]
        assert logged == [True, True, False, False, False]
        clock.advance(10.0)
        assert events.line("dev1", "mqtt.connected", client="dev1", level=5)
    assert [r.getMessage() for r in caplog.records] == [
        "mqtt.connected client=dev1 level=4",
        "mqtt.connected client=dev1 level=4",
        "mqtt.connected client=dev1 level=5 suppressed=3",
    ]
    assert (events.total, events.suppressed) == (6, 3)
