"""Manifest documents before any model sees them, with no pydantic (a serving hub reads and sends documents to
the check; it does not validate them itself: ``edgehub.runtime.deployment.check``): ``ManifestError``, a manifest
file read within its bounds (``read_manifest_file``), the ``$edgeHub`` section of a document
(``edgehub_section``), and one error for many problems (``refusal``).

Bounds, checked before pydantic sees the document (a refusal with a location, never a RecursionError, a
ValueError or a UnicodeError): a manifest file is at most ``MAX_MANIFEST_BYTES`` of UTF-8; a document nests
at most ``MAX_DEPTH`` levels (Azure IoT Hub allows twins 10 levels deep, and deeper JSON sends Python's parser
and pydantic's serializer into their recursion limits); every string in it is valid Unicode (a lone
surrogate escape such as ``"\\ud800"`` is JSON but cannot be written out as UTF-8: a queue named by it would
fail in the store).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from edgehub.core import ConfigurationError

__all__ = [
    "MAX_DEPTH",
    "MAX_ERRORS",
    "MAX_MANIFEST_BYTES",
    "MAX_PARTITIONS",
    "ManifestError",
    "edgehub_section",
    "read_manifest_file",
    "refusal",
]

MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_PARTITIONS = 64  # upstream.partitions (the command line's --upstream-partitions too)
MAX_ERRORS = 100  # a document with more problems lists the first ones (and says how many more)
_LONG_INTEGER = re.compile(r"[0-9]{4000,}")  # int() refuses more than 4,300 digits (sys.get_int_max_str_digits)


class ManifestError(ConfigurationError):
    """A manifest that cannot be applied; the running configuration stays. ``errors`` lists every problem found,
    each ``location: what`` (``storeAndForwardConfiguration.maxQueueByts: unknown key``)."""

    def __init__(self, message: str, errors: tuple[str, ...] | None = None) -> None:
        super().__init__(message)
        self.errors: tuple[str, ...] = errors if errors is not None else (message,)


def _where(path: tuple[str | int, ...]) -> str:
    # Escaped: a name that is not valid Unicode must not make the error itself unprintable.
    shown = ".".join(str(p).encode("utf-8", "backslashreplace").decode("utf-8") for p in path[:8])
    return (shown + ".…" if len(path) > 8 else shown) or "(top)"


def _check_document(document: Any) -> None:
    """ManifestError naming the first value nested deeper than MAX_DEPTH or the first string that is not valid
    Unicode. Iterative: a document of any depth is walked without recursion."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise ManifestError(f"{_where(path)}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and not _is_unicode(k):
                    raise ManifestError(f"{_where((*path, k))}: the name is not valid Unicode (a lone surrogate)")
                stack.append((v, (*path, k)))
        elif isinstance(value, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(value))
        elif isinstance(value, str) and not _is_unicode(value):
            raise ManifestError(f"{_where(path)}: the string is not valid Unicode (a lone surrogate)")


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _line_column(text: str, pos: int) -> tuple[int, int]:
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _too_deep_at(text: str) -> int:
    """Where ``text`` first opens more than MAX_DEPTH brackets (strings skipped), or 0."""
    depth = 0
    for m in re.finditer(r'"(?:\\.|[^"\\])*"|[\[\]{}]', text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return m.start()
        elif c in "]}":
            depth -= 1
    return 0


def edgehub_section(document: Any) -> tuple[Any, bool]:
    """The ``$edgeHub`` desired properties of a deployment manifest (``{"modulesContent": {...}}``, or the modules
    alone: ``{"$edgeHub": ..., "<module>": ...}``) and True, or the document itself when it is the desired
    properties alone, and False. Errors name paths within the desired properties."""
    if not isinstance(document, dict):
        raise ManifestError(f"(top): a manifest is a JSON object, not {type(document).__name__}")
    _check_document(document)
    content = document.get("modulesContent")
    if content is None and "$edgeHub" in document:
        content = document  # the modules' part alone, as Azure's documentation shows deployments
    if content is None:
        return document, False
    try:
        return content["$edgeHub"]["properties.desired"], True
    except (KeyError, TypeError) as exc:
        raise ManifestError("deployment manifest has no modulesContent.$edgeHub.properties.desired") from exc


def refusal(what: str, problems: list[str]) -> ManifestError:
    """One ManifestError for ``problems`` (at most ``MAX_ERRORS`` of them listed)."""
    shown = problems[:MAX_ERRORS]
    if len(problems) > MAX_ERRORS:
        shown.append(f"(and {len(problems) - MAX_ERRORS} more)")
    return ManifestError(f"{what}: {'; '.join(shown)}", tuple(shown))


def read_manifest_file(path: str | Path) -> Any:
    """A manifest file's JSON document (bounded in size and depth, UTF-8); ``ManifestError`` with the position."""
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc.strerror}") from exc
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: over the limit of {MAX_MANIFEST_BYTES} bytes for a manifest")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ManifestError(f"{path}: not UTF-8 at line {line}, column {column} (byte {exc.start})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from exc
    except RecursionError:
        # Deeper than Python's parser goes (about 1,000 levels); _check_document refuses what is less deep.
        line, column = _line_column(text, _too_deep_at(text))
        raise ManifestError(f"{path}: nested deeper than {MAX_DEPTH} levels at line {line}, column {column}") from None
    except ValueError as exc:  # an integer of more digits than int() converts
        m = _LONG_INTEGER.search(text)
        where = " at line {}, column {}".format(*_line_column(text, m.start())) if m else ""
        raise ManifestError(f"{path}: not JSON this hub reads{where}: {exc}") from exc
