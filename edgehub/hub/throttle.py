"""Throttling of failed logins, per source address and per claimed identity. Protocol-neutral (the MQTT and
AMQP heads share it).

Without it a peer could try 436 passwords a second. Each key (a source address, a claimed identity: the head
chooses them, and keeps one throttle per kind when their limits differ) may fail ``max_failures`` times per
``window_s``; after that every attempt naming that key is
refused at once, without asking the authenticator, until the window has passed. A fixed window per key keeps
the cost at one dict look-up per key and attempt.

Invariants:
* ``blocked`` and ``failed`` are O(number of keys given); memory is bounded by ``max_keys`` (the key that
  failed longest ago is forgotten first).
* A success clears that identity's failures only when the head says so (``succeeded``); a source address is
  never cleared by one success, or one valid credential would reset a guesser's count.
"""

from __future__ import annotations

from collections import OrderedDict

from edgehub.core.clock import Clock, SystemClock

__all__ = ["LoginThrottle"]


class LoginThrottle:
    """``blocked(*keys)`` before authenticating; ``failed(*keys)`` after a refusal; ``succeeded(key)``."""

    def __init__(
        self, *, max_failures: int = 5, window_s: float = 60.0, max_keys: int = 10_000, clock: Clock | None = None
    ) -> None:
        if max_failures < 1 or window_s <= 0 or max_keys < 1:
            raise ValueError("max_failures, window_s and max_keys must be positive")
        self.max_failures = max_failures
        self.window_s = window_s
        self._max_keys = max_keys
        self._clock = clock or SystemClock()
        self._failures: OrderedDict[str, tuple[float, int]] = OrderedDict()  # key -> (window start, count)
        self.refused = 0  # logins ``blocked`` refused so far (for /metrics)

    def blocked(self, *keys: str) -> bool:
        """Whether any of ``keys`` has used up its failures in the current window (counted in ``refused``: a head
        that asks two throttles in turn stops at the first that refuses, so a refusal is counted once)."""
        now = self._clock.monotonic()
        for key in keys:
            state = self._failures.get(key)
            if state is not None and now - state[0] < self.window_s and state[1] >= self.max_failures:
                self.refused += 1
                return True
        return False

    def failed(self, *keys: str) -> None:
        """Count one failed login against each of ``keys``."""
        now = self._clock.monotonic()
        failures = self._failures
        for key in keys:
            state = failures.pop(key, None)
            if state is None or now - state[0] >= self.window_s:
                state = (now, 0)
            failures[key] = (state[0], state[1] + 1)  # re-inserted last: the most recent failure
            if len(failures) > self._max_keys:
                failures.popitem(last=False)

    def succeeded(self, key: str) -> None:
        """Forget ``key``'s failures (an identity that proved itself)."""
        self._failures.pop(key, None)

    def __len__(self) -> int:
        return len(self._failures)
