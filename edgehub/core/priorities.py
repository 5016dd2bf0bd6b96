"""Sets of message priorities written as text: ``"0-2"``, ``"0,1,5"``, ``"0-1,5-10"``; one home for the parse, which
the manifest (checking) and the upstream links (choosing) both use.

Priorities run 0 (highest) to ``DEFAULT_PRIORITY`` (10: a route that gives none). A set is never empty.
"""

from __future__ import annotations

from edgehub.core.routes import DEFAULT_PRIORITY

__all__ = ["ALL_PRIORITIES", "format_priorities", "parse_priorities"]

ALL_PRIORITIES = frozenset(range(DEFAULT_PRIORITY + 1))
MAX_PRIORITY_TEXT = 64  # "0,1,2,...,10" is 24 characters: anything longer is no priority set


def parse_priorities(text: str) -> frozenset[int]:
    """The priorities ``text`` names; ``ValueError`` saying what is wrong (an empty set, a range upside down, a
    priority outside 0-10, anything that is not a number)."""
    if len(text) > MAX_PRIORITY_TEXT:
        raise ValueError(f"a priority set is at most {MAX_PRIORITY_TEXT} characters")
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo_text, sep, hi_text = part.partition("-")
        if not lo_text.strip().isdigit() or (sep and not hi_text.strip().isdigit()):
            raise ValueError(f"{text!r} is not a priority set: write '0-2' or '0,1,5' (0 highest, {DEFAULT_PRIORITY})")
        lo = int(lo_text)
        hi = int(hi_text) if sep else lo
        if lo > hi:
            raise ValueError(f"priority range {part!r} runs backwards")
        if hi > DEFAULT_PRIORITY:
            raise ValueError(f"priority {hi} is outside 0-{DEFAULT_PRIORITY}")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def format_priorities(priorities: frozenset[int]) -> str:
    """The shortest text ``parse_priorities`` reads back as ``priorities`` (``"0-1,5"``); ``""`` for none."""
    runs: list[tuple[int, int]] = []
    for p in sorted(priorities):
        if runs and runs[-1][1] == p - 1:
            runs[-1] = (runs[-1][0], p)
        else:
            runs.append((p, p))
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)
