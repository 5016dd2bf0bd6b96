"""Reading the documentation the way the tests in this folder need it: its pages, their fenced blocks, the rows of
a table, and the blocks marked to be run.

A block is run by ``test_docs_commands`` when the line just before its opening fence is ``RUN_MARK`` (an HTML
comment: MkDocs passes it through, a browser shows nothing). A ``text`` block right after a run block is the
output the page promises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DOCS", "REPO", "RUN_MARK", "Block", "RunnableBlock", "blocks", "pages", "runnable_blocks", "table_rows"]

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
RUN_MARK = "<!-- docs-test: tests/docs runs this block as written; a text block right after it is its output -->"

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    """A fenced block: its language (``sh``, ``text``, ...), its text, and where it stands."""

    page: Path
    line: int  # 1-based line of the opening fence
    end: int  # 1-based line of the closing fence
    lang: str
    text: str
    marked: bool  # the line before the fence is RUN_MARK

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


@dataclass(frozen=True, slots=True)
class RunnableBlock:
    block: Block
    output: Block | None  # the text block right after it, if any


def pages() -> list[Path]:
    """The README and every page of docs/."""
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, in order (indented ones, inside list items, included)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, start = len(m["indent"]), i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        marked = start > 0 and lines[start - 1].strip() == RUN_MARK
        out.append(Block(page, start + 1, i + 1, m["lang"], "\n".join(body) + "\n", marked))
        i += 1
    return out


def runnable_blocks() -> list[RunnableBlock]:
    """Every block marked to be run, with the text block that follows it (only blank lines between)."""
    out: list[RunnableBlock] = []
    for page in pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        found = blocks(page)
        for i, here in enumerate(found):
            if not here.marked:
                continue
            after = found[i + 1] if i + 1 < len(found) else None
            output = None
            if after is not None and after.lang == "text":
                between = lines[here.end : after.line - 1]  # the lines after the closing fence, before the next
                if all(not x.strip() for x in between):
                    output = after
            out.append(RunnableBlock(here, output))
    return out


def table_rows(page: Path, heading: str) -> list[list[str]]:
    """The body rows of the first table under ``heading`` (a whole heading line, ``## Every key``), as cells.
    A cell's ``\\|`` is a literal bar, not a separator."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    rows: list[list[str]] = []
    in_table = False
    for line in lines[start + 1 :]:
        m = re.match(r"^(#+) ", line)
        if m is not None and len(m[1]) <= level:
            break
        if line.startswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if in_table and not all(set(c) <= {"-", ":"} for c in cells):
                rows.append(cells)
            in_table = True
        elif in_table:
            break
    return rows
