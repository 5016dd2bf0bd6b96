"""Fuzzing the manifest loader: random documents, mutated example manifests (as documents and as bytes), and
deep nesting (tests/fuzz/manifest_checks.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given

from tests.fuzz.budget import fuzz_settings
from tests.fuzz.manifest_checks import check_manifest_bytes, check_manifest_document
from tests.fuzz.manifest_inputs import EXAMPLES, documents, mutated_documents, mutated_texts, nested_texts


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file for every example (a test's examples run one after another, and each writes it anew)."""
    return tmp_path_factory.mktemp("manifest") / "manifest.json"


@fuzz_settings(200)
@given(documents())
def test_random_documents_load_or_give_a_manifest_error(document: Any) -> None:
    check_manifest_document(document)


@fuzz_settings(200)
@given(mutated_documents())
def test_mutated_example_manifests_load_or_give_a_manifest_error(scratch: Path, document: Any) -> None:
    check_manifest_document(document)
    check_manifest_bytes(json.dumps(document).encode(), scratch)


@fuzz_settings(200)
@given(mutated_texts())
def test_example_manifest_bytes_changed_anywhere_load_or_give_a_manifest_error(scratch: Path, raw: bytes) -> None:
    check_manifest_bytes(raw, scratch)


@fuzz_settings(100)
@given(nested_texts())
def test_nesting_of_any_depth_loads_or_gives_a_manifest_error(scratch: Path, raw: bytes) -> None:
    check_manifest_bytes(raw, scratch)


def test_the_example_manifests_load_and_build_their_routers(tmp_path: Path) -> None:
    assert EXAMPLES, "deployment/examples/ has manifests to mutate"
    for example in EXAMPLES:
        assert check_manifest_bytes(example.read_bytes(), tmp_path / "m.json") is not None
