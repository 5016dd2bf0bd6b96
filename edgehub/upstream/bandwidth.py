"""The upstream's bandwidth budget: a token bucket on bytes (``maxUplinkBps``) and an achieved-rate estimate.

``TokenBucket``: ``await take(n)`` returns once ``n`` bytes fit the budget. Tokens refill at ``rate_bps / 8``
bytes a second up to ``burst_bytes``; a request larger than the burst is let through with a debt that later
requests pay off, so a large segment is never starved and the long-run rate still holds. Waiters are served
in arrival order (one lock), so a later small request cannot overtake an earlier large one.

``RateEstimator``: bytes acknowledged over a sliding window of ``window_s`` seconds; ``rate_bps()`` is what
status reports as the achieved rate. Both run on an ``edgehub.core.Clock`` so tests steer time.
"""

from __future__ import annotations

import asyncio
from collections import deque

from edgehub.core import Clock

__all__ = ["RateEstimator", "TokenBucket", "bdp_bytes"]


def bdp_bytes(rate_bps: float, rtt_s: float, *, floor: int = 4096) -> int:
    """One bandwidth-delay product in bytes (at least ``floor``, so tiny links still carry a whole packet)."""
    if rate_bps <= 0 or rtt_s < 0:
        raise ValueError("rate_bps must be positive and rtt_s non-negative")
    return max(floor, int(rate_bps / 8 * rtt_s))


class TokenBucket:
    """Bytes at ``rate_bps`` bits per second, burst ``burst_bytes``. ``rate_bps=None``: no limit."""

    def __init__(self, *, rate_bps: float | None, burst_bytes: int, clock: Clock) -> None:
        if rate_bps is not None and rate_bps <= 0:
            raise ValueError("rate_bps must be positive or None")
        if burst_bytes <= 0:
            raise ValueError("burst_bytes must be positive")
        self._rate_bps = rate_bps
        self.burst_bytes = burst_bytes
        self._clock = clock
        self._tokens = float(burst_bytes)
        self._at = clock.monotonic()
        self._lock = asyncio.Lock()

    @property
    def rate_bps(self) -> float | None:
        return self._rate_bps

    def set_rate(self, rate_bps: float | None) -> None:
        if rate_bps is not None and rate_bps <= 0:
            raise ValueError("rate_bps must be positive or None")
        self._refill()
        self._rate_bps = rate_bps

    def _refill(self) -> None:
        now = self._clock.monotonic()
        if self._rate_bps is not None:
            self._tokens = min(float(self.burst_bytes), self._tokens + (now - self._at) * self._rate_bps / 8)
        self._at = now

    @property
    def tokens(self) -> float:
        """Bytes that may go now (negative: a debt still being paid off)."""
        self._refill()
        return self._tokens

    async def take(self, n: int) -> None:
        """Wait until ``n`` bytes may go, then spend them."""
        if n < 0:
            raise ValueError("n must be non-negative")
        async with self._lock:
            while True:
                self._refill()
                rate = self._rate_bps
                if rate is None:
                    return
                # Go when the bucket holds n, or, for n above the burst, when it is full (the rest is debt).
                need = min(float(n), float(self.burst_bytes))
                if self._tokens >= need - 0.01:  # float refill must not leave a sliver to wait for
                    self._tokens -= n
                    return
                await self._clock.sleep((need - self._tokens) * 8 / rate)


class RateEstimator:
    """Achieved rate over the last ``window_s`` seconds, from byte counts recorded as they are acknowledged."""

    def __init__(self, *, clock: Clock, window_s: float = 10.0) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self._clock = clock
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()
        self._total = 0

    def record(self, n_bytes: int) -> None:
        self._samples.append((self._clock.monotonic(), n_bytes))
        self._total += n_bytes
        self._trim()

    def _trim(self) -> None:
        horizon = self._clock.monotonic() - self.window_s
        while self._samples and self._samples[0][0] < horizon:
            self._total -= self._samples.popleft()[1]

    def rate_bps(self) -> float:
        """Bits per second over the window (0.0 when nothing was recorded in it)."""
        self._trim()
        return self._total * 8 / self.window_s
