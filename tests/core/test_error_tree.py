"""The error tree drawn in ``edgehub.core.errors`` names every error class the project defines, under its parent."""

from __future__ import annotations

import importlib
import pkgutil
import re

import edgehub
import protocol_heads
import spark_upload
from edgehub.core import errors
from edgehub.core.errors import EdgeHubError

# Modules that need what only some machines have, or run work when imported.
_SKIP = re.compile(r"\.__main__$")


def _import_everything() -> None:
    for package in (edgehub, protocol_heads, spark_upload):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not _SKIP.search(info.name):
                importlib.import_module(info.name)


def _all_subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    out: set[type[BaseException]] = set()
    stack = [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub.__module__.split(".")[0] in {"edgehub", "protocol_heads", "spark_upload"} and sub not in out:
                out.add(sub)
                stack.append(sub)
    return out


def _drawn_parents() -> dict[str, str]:
    """Each class name in the drawing -> the name of the class drawn above it (by indentation)."""
    doc = errors.__doc__ or ""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        m = re.match(r"^\s*((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+Error|\w+)\b", line)
        if m is None or not line.strip() or not (line.lstrip().startswith(("E", "├", "└", "│"))):
            continue
        name = m.group(2)
        if not name[0].isupper():
            continue
        depth = len(m.group(1)) // 4 + (1 if "──" in line else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parents[name] = stack[-1][1]
        stack.append((depth, name))
    return parents


def test_every_error_class_is_drawn_in_the_tree_under_its_parent() -> None:
    _import_everything()
    drawn = _drawn_parents()
    missing = sorted(c.__name__ for c in _all_subclasses(EdgeHubError) if c.__name__ not in drawn)
    assert missing == [], f"not in the drawing of edgehub/core/errors.py: {missing}"
    wrong = {
        c.__name__: (drawn[c.__name__], c.__bases__[0].__name__)
        for c in _all_subclasses(EdgeHubError)
        if drawn[c.__name__] != c.__bases__[0].__name__
    }
    assert wrong == {}, f"drawn under another parent (drawn, actual): {wrong}"
