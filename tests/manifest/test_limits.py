"""The manifest loader's bounds: whatever the file holds, the answer is a ManifestError with a location (found
by fuzzing: deep JSON raised RecursionError, a 5,000-digit number ValueError, a byte that is not UTF-8
UnicodeDecodeError, and a lone surrogate escape loaded and then failed where it was written out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgehub.manifest import MAX_DEPTH, MAX_MANIFEST_BYTES, ManifestError, load_desired, load_desired_file


def write(tmp_path: Path, raw: bytes) -> Path:
    p = tmp_path / "manifest.json"
    p.write_bytes(raw)
    return p


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 900, 100_000])
def test_json_nested_past_the_limit_is_refused_with_its_line_and_column(tmp_path: Path, depth: int) -> None:
    raw = b'{"schemaVersion": "1.1",\n "deep": ' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(ManifestError, match=f"nested deeper than {MAX_DEPTH} levels") as err:
        load_desired_file(write(tmp_path, raw))
    if depth > 900:  # past Python's parser: the position of the bracket that went too deep (the object is one)
        assert f"line 2, column {9 + MAX_DEPTH}" in str(err.value)
    else:  # parsed, then refused naming the path
        assert "deep.0.0.0" in str(err.value)


def test_documents_nested_past_the_limit_are_refused_naming_the_path() -> None:
    # A module twin's desired properties are free JSON: the depth bound is what limits them.
    def manifest(depth: int) -> dict[str, Any]:
        return {
            "modulesContent": {
                "$edgeHub": {"properties.desired": {"schemaVersion": "1.1"}},
                "m": {"properties.desired": {"x": nested(depth)}},
            }
        }

    with pytest.raises(ManifestError, match=r"modulesContent\.m\.properties\.desired\.x\.0.*nested deeper"):
        load_desired(manifest(MAX_DEPTH))
    load_desired(manifest(MAX_DEPTH - 5))


def test_a_number_with_more_digits_than_python_converts_is_refused_with_its_position(tmp_path: Path) -> None:
    raw = b'{"schemaVersion": "1.1",\n  "x": ' + b"9" * 5000 + b"}"
    with pytest.raises(ManifestError, match="line 2, column 8"):
        load_desired_file(write(tmp_path, raw))


def test_bytes_that_are_not_utf8_are_refused_with_their_position(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"not UTF-8 at line 2, column 3 \(byte 27\)"):
        load_desired_file(write(tmp_path, b'{"schemaVersion": "1.1",\n "\xff": 1}'))


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (rb'{"schemaVersion": "1.1", "routes": {"r\ud800": "FROM /* INTO $upstream"}}', r"routes\.r\\ud800: the name"),
        (rb'{"schemaVersion": "1.1", "routes": {"r": "FROM /* WHERE a = \"\udfff\" INTO $upstream"}}', "routes.r: the"),
    ],
)
def test_lone_surrogate_escapes_are_refused_naming_where(tmp_path: Path, raw: bytes, where: str) -> None:
    with pytest.raises(ManifestError, match=where) as err:
        load_desired_file(write(tmp_path, raw))
    str(err.value).encode("utf-8")  # the error itself can be printed and logged


def test_a_file_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    raw = b'{"schemaVersion": "1.1", "x": "' + b"a" * MAX_MANIFEST_BYTES + b'"}'
    with pytest.raises(ManifestError, match=f"over the limit of {MAX_MANIFEST_BYTES} bytes"):
        load_desired_file(write(tmp_path, raw))
