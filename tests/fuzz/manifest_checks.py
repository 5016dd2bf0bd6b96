"""The properties the manifest loader keeps on any input; the tests in this folder and ``python -m bench.fuzz``
run them.

* ``load_desired_file`` and ``load_desired`` give desired properties or raise ``ManifestError`` (a
  ConfigurationError) whose message says where (the file, the line and column, or the field) and renders as
  UTF-8; nothing else.
* What loads can be used: its routes build a ``Router`` or raise a ``RouteError``, and it serialises to JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgehub.manifest import EdgeHubDesired, ManifestError, load_desired, load_desired_file
from edgehub.routing import RouteError, Router

__all__ = ["check_manifest_bytes", "check_manifest_document"]


def _check_refusal(err: ManifestError) -> None:
    text = str(err)
    # Where, then what: a file's path or a field's path (``(top)`` for the whole document), or the one section
    # a deployment manifest lacks.
    assert ": " in text or "no modulesContent" in text, text
    text.encode("utf-8")  # printable and loggable


def _use(desired: EdgeHubDesired) -> None:
    try:
        Router(desired.route_specs())
    except RouteError as err:
        str(err).encode("utf-8")
    json.loads(desired.model_dump_json())


def check_manifest_document(document: Any) -> EdgeHubDesired | None:
    try:
        desired = load_desired(document)
    except ManifestError as err:
        _check_refusal(err)
        return None
    _use(desired)
    return desired


def check_manifest_bytes(raw: bytes, path: Path) -> EdgeHubDesired | None:
    path.write_bytes(raw)
    try:
        desired = load_desired_file(path)
    except ManifestError as err:
        _check_refusal(err)
        return None
    _use(desired)
    return desired
