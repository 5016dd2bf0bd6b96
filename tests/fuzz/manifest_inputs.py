"""Hypothesis strategies for the manifest loader: random JSON documents shaped like ``$edgeHub`` desired
properties, the example manifests of deployment/examples/ with values replaced, removed or added, their text
with bytes changed, and deep nesting."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

__all__ = ["EXAMPLES", "documents", "mutated_documents", "mutated_texts", "nested_texts"]

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "deployment" / "examples").glob("*.json"))
_FIELDS = [
    "schemaVersion",
    "routes",
    "route",
    "priority",
    "timeToLiveSecs",
    "storeAndForwardConfiguration",
    "upstream",
    "partitions",
    "duplicateDetection",
    "duplicateDetectionWindowSecs",
    "wireMode",
    "maxUplinkBps",
    "maxBatchBytes",
    "lingerMs",
    "maxInflightBytes",
    "linkRateBps",
    "linkRttMs",
    "compression",
    "maxPacketBytes",
    "brokerMaxPacketBytes",
    "modulesContent",
    "$edgeHub",
    "properties.desired",
]
_SPECIAL = ["1.1", "1.0", "1.4", "FROM /* INTO $upstream", "FROM /x WHERE (((", "batch", "zstd", "\ud800"]


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**64), 2**64),
        st.integers(-(10**50), 10**50),
        st.floats(),  # NaN and infinities too: json.dumps writes them, json.loads reads them
        st.text(max_size=12),
        st.sampled_from(_SPECIAL),
    )
    keys = st.one_of(st.sampled_from(_FIELDS), st.text(max_size=8))
    return st.recursive(
        scalars,
        lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(keys, c, max_size=5)),
        max_leaves=max_leaves,
    )


def documents() -> st.SearchStrategy[Any]:
    """Random documents, mostly objects with the manifest's own field names."""
    return st.one_of(
        json_values(),
        st.dictionaries(st.sampled_from(_FIELDS), json_values(6), max_size=6),
        st.dictionaries(st.sampled_from(_FIELDS), json_values(6), max_size=4).map(
            lambda d: {"schemaVersion": "1.1", **d}
        ),
    )


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    """An example manifest with a few values replaced by random JSON, keys removed or keys added."""
    doc = json.loads(draw(st.sampled_from(EXAMPLES)).read_text())
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            continue
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        how = draw(st.sampled_from(["replace", "remove", "add"]))
        if how == "replace":
            parent[path[-1]] = draw(json_values(6))
        elif how == "remove" and isinstance(parent, dict):
            del parent[path[-1]]
        elif how == "add" and isinstance(parent, dict):
            parent[draw(st.one_of(st.sampled_from(_FIELDS), st.text(max_size=6)))] = draw(json_values(4))
    return doc


@st.composite
def mutated_texts(draw: st.DrawFn) -> bytes:
    """An example manifest's bytes with a few changed, inserted or deleted."""
    raw = bytearray(draw(st.sampled_from(EXAMPLES)).read_bytes())
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(raw) - 1))
        how = draw(st.sampled_from(["set", "insert", "delete"]))
        if how == "set":
            raw[i] = draw(st.integers(0, 0xFF))
        elif how == "insert":
            raw[i:i] = draw(st.sampled_from([b"[", b"{", b"\\ud800", b"9" * 5000, b"\xff", b'"', b",", b"\x00"]))
        else:
            del raw[i]
    return bytes(raw)


@st.composite
def nested_texts(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(1, 3000))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    inner = opener * depth + b"1" + closer * depth
    return b'{"schemaVersion": "1.1", "upstream": {"x": ' + inner + b"}}"
