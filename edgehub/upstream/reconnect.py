"""When an upstream transport tries its link again after a failed connect: one rule for every way it can fail.

A hard cut (the modem resets, connections are refused or reset) fails each attempt at once and costs next to
nothing, so a dead link is tried again at a steady short interval, with jitter so that many hubs behind one
carrier do not dial in lockstep: the first attempt after the link returns is at most one interval (plus its
jitter) away, however long the cut lasted. Two failures are different:

* an attempt that **hung** until its connect timeout (a silent link: no answer at all) has already waited that
  long; the next one starts at once, so one attempt is always on its way and hears first when the link returns;
* an attempt the far side **answered and refused** (a CONNACK refusing the credentials or the client id) will
  be refused again until someone changes something: the schedule backs off hard, doubling from
  ``refused_min_s`` up to ``refused_max_s``, and such a wait is not cut short by the executor's sends.

Invariants: ``delay_s`` never exceeds ``interval_s * (1 + jitter)`` for a failure that is neither a hang nor a
refusal, whatever came before it; a refusal's delay grows with the refusals in a row and never exceeds
``refused_max_s``; only a successful connect starts the refusal count over (the caller's job).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from edgehub.core import FailureKind

__all__ = ["DEFAULT_SCHEDULE", "ConnectFailure", "ReconnectSchedule", "connect_failure_of"]


class ConnectFailure(StrEnum):
    """How a connect attempt failed, which decides the wait before the next one."""

    AT_ONCE = "at_once"  # refused or reset: the link (or the peer's port) is down
    HUNG = "hung"  # no answer until the connect timeout: a silent link
    REFUSED = "refused"  # the far side answered and said no (bad credentials)


def connect_failure_of(kind: FailureKind) -> ConnectFailure:
    """The transports' failure kinds as connect failures: TIMEOUT hung, PERMANENT was refused by the far side,
    anything else failed at once."""
    if kind is FailureKind.TIMEOUT:
        return ConnectFailure.HUNG
    if kind is FailureKind.PERMANENT:
        return ConnectFailure.REFUSED
    return ConnectFailure.AT_ONCE


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconnectSchedule:
    """The waits between connect attempts (see the module docstring). Units in the names; jitter a fraction."""

    interval_s: float = 0.5
    jitter: float = 0.5
    refused_min_s: float = 5.0
    refused_max_s: float = 300.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.refused_min_s <= 0 or self.refused_max_s <= 0:
            raise ValueError("interval_s, refused_min_s and refused_max_s must be positive")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a fraction in [0, 1]")

    def delay_s(self, failure: ConnectFailure, refusals: int = 0, rng: random.Random | None = None) -> float:
        """The wait before the next attempt after ``failure``; ``refusals``: refused attempts in a row so far,
        this one included (only read for ``REFUSED``)."""
        r = (rng or random).uniform(0.0, self.jitter)
        match failure:
            case ConnectFailure.HUNG:
                return 0.0
            case ConnectFailure.REFUSED:
                base = min(self.refused_max_s, self.refused_min_s * 2.0 ** max(0, refusals - 1))
                return min(self.refused_max_s, base * (1 + r))
            case ConnectFailure.AT_ONCE:
                return self.interval_s * (1 + r)


# The defaults, which every setting of the reconnect waits (the MQTT upstream's) takes its own defaults from.
DEFAULT_SCHEDULE = ReconnectSchedule()
