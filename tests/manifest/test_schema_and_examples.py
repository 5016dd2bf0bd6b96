"""The committed JSON Schema is what the models give, and every example in deployment/examples loads and runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgehub.manifest import parse_deployment, read_manifest_file
from edgehub.manifest.schema import SCHEMA_PATH, schema_text
from edgehub.runtime.deployment.settings import StartSettings, running_settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "deployment" / "examples").glob("*.json"))


def test_the_committed_schema_is_the_one_the_models_generate() -> None:
    committed = (ROOT / SCHEMA_PATH).read_text(encoding="utf-8")
    assert committed == schema_text(), "stale: run `python -m edgehub.manifest.schema` and commit the result"


def test_the_schema_refuses_unknown_keys_in_every_object() -> None:
    import json

    schema = json.loads(schema_text())
    objects = [d for d in schema["$defs"].values() if d.get("type") == "object"] + [schema]
    assert all(o.get("additionalProperties") is False for o in objects if "properties" in o)


def test_the_four_documented_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"priorities-and-ttl", "module-pipeline", "quotas-and-overflow", "nested-gateway"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_loads_and_gives_running_settings(path: Path) -> None:
    deployment = parse_deployment(read_manifest_file(path))
    running_settings(deployment.desired, StartSettings())
