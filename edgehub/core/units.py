"""Rates and durations as people write them on a command line (``64kbit``, ``300ms``): one parser for each.

Here, not beside the link simulator that first needed them, so that ``edgehub run`` can read its flags without
loading ``edgehub.testing`` (the test doubles cost ~1 MB of RSS in a serving process). Standard library only.
"""

from __future__ import annotations

import re

__all__ = ["parse_duration_s", "parse_rate_bps"]

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmg]?)(bit|bps|b)?(/s)?\s*$", re.IGNORECASE)
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
_DUR_SCALE = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_rate_bps(text: str) -> float:
    """``64kbit``, ``1.5mbit``, ``9600`` (bit/s) as bits per second, in the way ``tc`` writes rates."""
    m = _RATE.match(text)
    if not m:
        raise ValueError(f"not a rate: {text!r} (try 64kbit)")
    value = float(m.group(1)) * _SCALE[m.group(2).lower()]
    if value <= 0:
        raise ValueError(f"rate must be positive: {text!r}")
    return value


def parse_duration_s(text: str) -> float:
    """``300ms``, ``60s``, ``5m``, ``1.5`` (seconds) as seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (try 300ms)")
    return float(m.group(1)) * _DUR_SCALE[(m.group(2) or "s").lower()]
