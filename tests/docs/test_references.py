"""The repository carries its own documentation: nothing in it sends a reader to files outside it, and the
Markdown outside docs/ (which MkDocs does not check) links only to files the repository holds."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.docs.pages import REPO

# Design and route-language files that once lived beside the repository, and the folder that held them.
OUTSIDE = re.compile(r"\.\./shared|shared folder|\bDESIGN\.md|\bROUTE_LANGUAGE\.md", re.IGNORECASE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def repository_files() -> list[Path]:
    """The files git tracks, and the new ones it would (not the ignored: venvs, build output, data)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        check=True,
        timeout=30,
    ).stdout.decode()
    return [REPO / name for name in listed.split("\0") if name and (REPO / name).is_file()]


def test_nothing_in_the_repository_points_at_design_files_outside_it() -> None:
    this = Path(__file__).resolve()
    found = []
    for path in repository_files():
        if path.resolve() == this:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        found += [
            f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m[0]}" for m in OUTSIDE.finditer(text)
        ]
    assert found == []


@pytest.mark.parametrize(
    "page",
    [p for p in repository_files() if p.suffix == ".md" and REPO / "docs" not in p.parents],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_markdown_outside_docs_links_only_to_files_in_the_repository(page: Path) -> None:
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+://", target) or target.startswith("#"):
            continue  # a web address, or an anchor on the same page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert REPO in path.parents, f"{page.relative_to(REPO)} links outside the repository: {target}"
        assert path.exists(), f"{page.relative_to(REPO)} links to a missing file: {target}"


def test_the_readme_is_a_front_door_of_at_most_200_lines() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
