"""``--log-format``: the JSON formatter writes one object per record with the event and its key=value fields."""

from __future__ import annotations

import io
import json
import logging
import sys

from edgehub.core.refusals import RefusalLog, RefusalReason
from edgehub.runtime.logs import JsonFormatter, LogFormat, configure_logging


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("edgehub.x", logging.WARNING, __file__, 1, msg, args, exc_info)


def test_a_json_line_holds_the_event_its_fields_and_the_whole_message() -> None:
    line = JsonFormatter().format(_record("store.write_failed path=%s error=%s", "/data/store", "disk full\nreally"))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "WARNING"
    assert doc["logger"] == "edgehub.x"
    assert doc["event"] == "store.write_failed"
    assert doc["path"] == "/data/store"
    assert doc["error"] == "disk"  # a value ends at its first space; the message keeps it all
    assert doc["message"] == "store.write_failed path=/data/store error=disk full\nreally"
    assert doc["ts"].endswith("+00:00")


def test_a_field_never_overwrites_a_fixed_name_and_a_traceback_goes_in_exc() -> None:
    doc = json.loads(JsonFormatter().format(_record("odd level=forged message=x ts=0", exc=True)))
    assert doc["level"] == "WARNING"
    assert doc["message"] == "odd level=forged message=x ts=0"
    assert "ValueError: boom" in doc["exc"]


def test_a_refusal_logged_as_json_names_the_reason_peer_and_client() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    try:
        configure_logging("info", LogFormat.JSON, stream=out)
        configure_logging("info", LogFormat.JSON, stream=out)  # a second call replaces the first handler
        RefusalLog(logging.getLogger("edgehub.test")).refused(
            RefusalReason.BAD_CREDENTIALS, peer="10.0.0.7:4242", client="dev9", detail="token expired"
        )
    finally:
        configure_logging("warning", LogFormat.TEXT, stream=io.StringIO())
        for h in [h for h in root.handlers if type(h).__name__ == "_HubHandler"]:
            root.removeHandler(h)
        root.setLevel(level)
    [line] = out.getvalue().splitlines()
    doc = json.loads(line)
    assert (doc["event"], doc["reason"], doc["peer"], doc["client"]) == (
        "refused",
        "bad_credentials",
        "10.0.0.7:4242",
        "dev9",
    )
