"""The executor's retry schedule, after OpenStack Zaqar's delivery policy.

Phases, counted in failed attempts: immediate (``retries_with_no_delay`` at 0 s), pre-backoff
(``minimum_delay_retries`` at ``minimum_delay_s``), backoff (``backoff_retries`` steps from ``minimum_delay_s`` to
``maximum_delay_s`` by ``backoff_function``, with ``jitter`` as a +/- fraction), post-backoff
(``maximum_delay_retries`` at ``maximum_delay_s``; ``None``: for ever, i.e. until the message's TTL). ``delay_s``
returns ``None`` once the policy has run out: the message is dead-lettered.

While an endpoint is parked (it reported itself unreachable), its sends are probes, spaced by ``probe_delay_s``: the
policy's delay, which never runs out there; but a probe that failed at once (``TRANSIENT``: not connected, the
connection refused) cost nothing, so the next one comes after at most ``probe_interval_s`` (+/- 25 % jitter), however
long the outage has lasted, and an endpoint back after a long hard cut is found within about that. A probe that hung
(``TIMEOUT``), was throttled or was refused by the far side (``PERMANENT``) backs off as the policy says.

The policy is set for the hub and may be overridden per endpoint unless the hub's says ``ignore_endpoint_override``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from edgehub.core import FailureKind

__all__ = ["BackoffFunction", "RetryPolicy", "effective_policy"]


class BackoffFunction(StrEnum):
    LINEAR = "linear"
    ARITHMETIC = "arithmetic"
    GEOMETRIC = "geometric"
    EXPONENTIAL = "exponential"


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Default: retry until TTL, exponential backoff from 1 s to 60 s."""

    retries_with_no_delay: int = 0
    minimum_delay_retries: int = 0
    minimum_delay_s: float = 1.0
    maximum_delay_s: float = 60.0
    backoff_retries: int = 7
    backoff_function: BackoffFunction = BackoffFunction.EXPONENTIAL
    maximum_delay_retries: int | None = None
    jitter: float = 0.0
    ignore_endpoint_override: bool = False
    probe_interval_s: float = 1.0  # the most between probes of a parked endpoint that failed at once

    def __post_init__(self) -> None:
        counts = (self.retries_with_no_delay, self.minimum_delay_retries, self.backoff_retries)
        if min(counts) < 0 or (self.maximum_delay_retries is not None and self.maximum_delay_retries < 0):
            raise ValueError("retry counts must be >= 0")
        if not 0 <= self.minimum_delay_s <= self.maximum_delay_s:
            raise ValueError("need 0 <= minimum_delay_s <= maximum_delay_s")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter is a fraction in [0, 1)")
        if self.probe_interval_s <= 0:
            raise ValueError("probe_interval_s must be positive")

    def delay_s(self, failures: int, rng: random.Random | None = None) -> float | None:
        """The wait before the next attempt after ``failures`` failed attempts (>= 1), or None: give up."""
        if failures < 1:
            raise ValueError("failures counts from 1")
        i = failures - 1
        if i < self.retries_with_no_delay:
            return 0.0
        i -= self.retries_with_no_delay
        if i < self.minimum_delay_retries:
            return self._jittered(self.minimum_delay_s, rng)
        i -= self.minimum_delay_retries
        if i < self.backoff_retries:
            return self._jittered(self._backoff(i + 1), rng)
        i -= self.backoff_retries
        if self.maximum_delay_retries is None or i < self.maximum_delay_retries:
            return self._jittered(self.maximum_delay_s, rng)
        return None

    def probe_delay_s(self, failures: int, kind: FailureKind | None = None, rng: random.Random | None = None) -> float:
        """The wait before probing a parked endpoint again after ``failures`` (>= 1) failed sends, the last one
        failing with ``kind`` (None: no probe failed yet, the endpoint reported itself unreachable). See the
        module docstring."""
        delay_s = self.delay_s(failures, rng)
        delay_s = self.maximum_delay_s if delay_s is None else delay_s
        if kind is FailureKind.TRANSIENT:
            steady = self.probe_interval_s * (rng or random).uniform(0.75, 1.25)
            return min(delay_s, steady)
        return delay_s

    def _backoff(self, step: int) -> float:
        lo, hi, n = self.minimum_delay_s, self.maximum_delay_s, self.backoff_retries
        match self.backoff_function:
            case BackoffFunction.LINEAR:
                d = lo + (hi - lo) * step / n
            case BackoffFunction.ARITHMETIC:
                d = lo + (hi - lo) * step * (step + 1) / (n * (n + 1))
            case BackoffFunction.GEOMETRIC:
                d = lo * (hi / lo) ** (step / n) if lo > 0 else hi * step / n
            case BackoffFunction.EXPONENTIAL:
                d = lo * 2.0 ** (step - 1) if lo > 0 else 2.0 ** (step - 1)
        return min(hi, d)

    def _jittered(self, d: float, rng: random.Random | None) -> float:
        if not self.jitter or d == 0:
            return d
        r = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, d * (1 + r))


def effective_policy(hub: RetryPolicy, endpoint_override: RetryPolicy | None) -> RetryPolicy:
    """The endpoint's override wins unless the hub policy ignores overrides."""
    if endpoint_override is None or hub.ignore_endpoint_override:
        return hub
    return endpoint_override
