"""Throttling of failed logins, per source address and per (source address, claimed identity). Protocol-neutral:
the one home of the rule, which both heads ask (and, in a running hub, one throttle shared by both, so a guesser
gets no second budget by changing protocol).

Without it a peer could try 436 passwords a second. An address may fail ``max_failures_per_address`` times per
``window_s`` whatever identities it names, and ``max_failures`` times for one identity; after that every
attempt from that address (or, for the pair, naming that identity from that address) is refused at once, without
asking the authenticator, until the window has passed. Failures are never counted against an identity alone: a
stranger who names a device must not lock out the device's valid logins from its own address, so a valid
credential from an address that has not failed always gets in. A fixed window per key keeps the cost at one
dict look-up per key and attempt.

Invariants:
* ``blocked`` and ``failed`` cost two dict look-ups; memory is bounded by ``max_keys`` (the key that failed
  longest ago is forgotten first); an identity is cut to ``MAX_IDENTITY_CHARS`` before it is a key.
* A success clears only its own (address, identity) pair (``succeeded``); a source address is never cleared by
  one success, or one valid credential would reset a guesser's count.
"""

from __future__ import annotations

from collections import OrderedDict

from edgehub.core.clock import Clock, SystemClock

__all__ = ["MAX_IDENTITY_CHARS", "LoginThrottle"]

MAX_IDENTITY_CHARS = 128  # longer claimed identities share the key of their first 128 characters

_Key = str | tuple[str, str]  # an address, or (address, identity)


class LoginThrottle:
    """``blocked(address, identity)`` before authenticating; ``failed(address, identity)`` after a refusal;
    ``succeeded(address, identity)`` after a login."""

    def __init__(
        self,
        *,
        max_failures: int = 5,
        max_failures_per_address: int = 30,
        window_s: float = 60.0,
        max_keys: int = 10_000,
        clock: Clock | None = None,
    ) -> None:
        if min(max_failures, max_failures_per_address, max_keys) < 1 or window_s <= 0:
            raise ValueError("max_failures, max_failures_per_address, window_s and max_keys must be positive")
        self.max_failures = max_failures
        self.max_failures_per_address = max_failures_per_address
        self.window_s = window_s
        self._max_keys = max_keys
        self._clock = clock or SystemClock()
        self._failures: OrderedDict[_Key, tuple[float, int]] = OrderedDict()  # key -> (window start, count)
        self.refused = 0  # logins ``blocked`` refused so far (for /metrics)

    def blocked(self, address: str, identity: str) -> bool:
        """Whether ``address`` has used up its failures, or its failures naming ``identity``, in the current
        window (counted in ``refused``)."""
        if self._over(address, self.max_failures_per_address) or self._over(
            (address, identity[:MAX_IDENTITY_CHARS]), self.max_failures
        ):
            self.refused += 1
            return True
        return False

    def _over(self, key: _Key, limit: int) -> bool:
        state = self._failures.get(key)
        return state is not None and self._clock.monotonic() - state[0] < self.window_s and state[1] >= limit

    def failed(self, address: str, identity: str) -> None:
        """Count one failed login from ``address`` naming ``identity``."""
        now = self._clock.monotonic()
        failures = self._failures
        for key in (address, (address, identity[:MAX_IDENTITY_CHARS])):
            state = failures.pop(key, None)
            if state is None or now - state[0] >= self.window_s:
                state = (now, 0)
            failures[key] = (state[0], state[1] + 1)  # re-inserted last: the most recent failure
            if len(failures) > self._max_keys:
                failures.popitem(last=False)

    def succeeded(self, address: str, identity: str) -> None:
        """Forget the failures of ``identity`` from ``address`` (it proved itself there); the address's own
        count stays."""
        self._failures.pop((address, identity[:MAX_IDENTITY_CHARS]), None)

    def __len__(self) -> int:
        return len(self._failures)
