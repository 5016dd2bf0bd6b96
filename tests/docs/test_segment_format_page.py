"""docs/segment-format.md against the code that writes and reads segments: its record table names every field a
line of each version holds and no other, and its codec table every codec."""

from __future__ import annotations

import re

from edgehub.upstream.segment import LINE_FIELDS, READ_VERSIONS, SEGMENT_FORMAT_VERSION, Codec
from tests.docs.pages import DOCS, table_rows

PAGE = DOCS / "segment-format.md"


def field_versions() -> dict[str, set[int]]:
    """The record table's fields, each with the versions its row says it is in (both when the row names none)."""
    out: dict[str, set[int]] = {}
    for name, *_ in table_rows(PAGE, "## Records"):
        m = re.fullmatch(r"(?:v(?P<v>\d): )?`(?P<field>\w+)`", name)
        assert m is not None, f"not a field in code: {name!r}"
        out[m["field"]] = {int(m["v"])} if m["v"] else set(READ_VERSIONS)
    return out


def test_the_record_table_lists_every_field_of_each_version_and_no_other() -> None:
    listed = field_versions()
    in_code = {f: {v for v in READ_VERSIONS if f in LINE_FIELDS[v]} for v in READ_VERSIONS for f in LINE_FIELDS[v]}
    assert listed == in_code


def test_the_codec_table_lists_every_codec_and_the_page_names_the_written_version() -> None:
    codecs = {name.strip("`") for name, *_ in table_rows(PAGE, "## Codecs")}
    assert codecs == {c.value for c in Codec}
    assert f"record format version {SEGMENT_FORMAT_VERSION}" in PAGE.read_text(encoding="utf-8")
