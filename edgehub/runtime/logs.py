"""How ``edgehub run`` writes its log: ``text`` for a terminal, ``json`` (one object per line) for journald and
log shippers. Standard library ``logging`` only.

Every log line of the hub reads ``event key=value key=value ...`` (the house style; refusals read ``refused
reason=R peer=P client=C ...``). A JSON line keeps that text whole in ``message`` and adds, for a shipper to
index without parsing: ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``event`` (the first
word) and each ``key=value`` word of the message as a field of its own (a value that holds spaces ends at the
first one; ``message`` always has all of it). A field never overwrites one of the fixed names. An exception's
traceback goes in ``exc``.

Invariants: one line per record whatever the message holds (newlines are escaped by JSON), and formatting never
raises (a value JSON cannot encode is written as its ``str``).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from enum import StrEnum
from typing import TextIO

__all__ = ["JsonFormatter", "LogFormat", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)=(\S*)")
_FIXED = frozenset(("ts", "level", "logger", "event", "message", "exc"))


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class JsonFormatter(logging.Formatter):
    """A record as one JSON object (see the module docstring for its fields)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": message.split(" ", 1)[0],
            "message": message,
        }
        for key, value in _FIELD.findall(message):
            if key not in _FIXED and key not in doc:
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def configure_logging(level: str, fmt: LogFormat | str = LogFormat.TEXT, *, stream: TextIO | None = None) -> None:
    """The root logger at ``level`` (a name: ``info``, ``DEBUG``, ...) writing ``fmt`` to ``stream`` (stderr)."""
    handler = _HubHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if LogFormat(fmt) is LogFormat.JSON else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _HubHandler)]:  # others' handlers (pytest's) stay
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


class _HubHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``configure_logging`` installs, so that a second call replaces it."""
