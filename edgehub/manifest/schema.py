"""The JSON Schema of the ``$edgeHub`` desired properties, generated from the models (their one home).

Usage: ``python -m edgehub.manifest.schema [OUT]`` writes it (default
``deployment/schema/edgehub-desired.schema.json``). ``tests/manifest/test_schema_and_examples.py`` fails when the
committed file differs from what the models give, so the schema an editor validates with never drifts from what
the hub accepts. The schema says what the models say: every object refuses keys it does not name
(``additionalProperties: false``), every number has its bounds. What the schema cannot say (route texts compile;
``mqttBroker`` acts from schemaVersion 1.2) the hub checks when it loads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from edgehub.manifest.models import EdgeHubDesired

__all__ = ["SCHEMA_ID", "SCHEMA_PATH", "desired_schema", "schema_text"]

SCHEMA_PATH = Path("deployment/schema/edgehub-desired.schema.json")
SCHEMA_ID = "https://github.com/edgehub/edgehub/deployment/schema/edgehub-desired.schema.json"


def desired_schema() -> dict[str, Any]:
    schema = EdgeHubDesired.model_json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "description": "edgehub's $edgeHub desired properties: Azure IoT Edge's schema 1.0-1.3 and edgehub's own "
        "sections (storeAndForwardConfiguration quota/fsync/cleanup keys, delivery, endpoints, upstream).",
        **schema,
    }


def schema_text() -> str:
    """The schema as it is committed: sorted keys, two-space indent, one newline at the end."""
    return json.dumps(desired_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else SCHEMA_PATH
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(schema_text(), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
