"""A client's words fit for a log line: the one sanitizer every head and the hub use for what a peer chose (a
client id, a topic, a method name, an error that quotes them).

Invariants: ``shown`` never raises for any text; what it returns is at most ``limit`` characters of the text
(and ``...``), and it is quoted with ``repr`` whenever the text holds a space or anything unprintable, so a peer
can neither forge a second ``key=value`` nor break the line.
"""

from __future__ import annotations

__all__ = ["shown"]


def shown(text: str, limit: int = 128) -> str:
    """``text`` bounded to ``limit`` characters, and quoted unless plain."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return text if text.isprintable() and " " not in text else repr(text)
