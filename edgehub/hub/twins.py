"""Twins: reported-properties patches checked against IoT Hub's limits, merged in memory, written once each.

``parse_reported_patch(raw, limits)`` is the one door a patch from the wire comes through: it returns the patch
(a ``dict``) or raises ``TwinError`` with IoT Hub's status and a ``RefusalReason``, and nothing else, whatever
the bytes (``tests/hub/test_twins.py`` holds it to that with Hypothesis). Its checks, in order, each bounded by
the one before:

1. at most ``max_patch_bytes`` (413, ``twin_too_large``): every later step is linear in this;
2. UTF-8 (400, ``twin_invalid``);
3. nesting at most ``max_depth`` levels below the patch's own object (400, ``twin_too_deep``), measured on the
   text, without recursion and before ``json.loads`` (which recurses once per level: a 100,000-deep patch
   raised ``RecursionError`` in the head's ingest task and its client never got another ack);
4. JSON, an object, no NaN or Infinity (400, ``twin_invalid``);
5. the values (``check_patch``, also what an in-process caller's ``Mapping`` goes through): at most
   ``max_keys`` keys in all, each at most ``max_key_bytes`` of UTF-8 and not starting with ``$`` below the top
   (top-level ``$`` keys, such as ``$version``, are ignored as before), strings valid UTF-8, integers within
   IoT Hub's ±2**52, only JSON types (400, ``twin_invalid``).

``TwinStore`` keeps each identity's twin (``{"desired": ..., "reported": ...}``) in the store's metadata under
``twin/{identity}`` and the ``max_cached`` most recently used in memory, so a patch is merged without reading
the store and each patch is one write; the store stays the source of truth (a restart, or a twin that fell out
of the cache, is read back from it). A patch whose merged reported document would pass ``max_reported_bytes``
is refused (413) and changes nothing. Patches are applied one at a time (a lock), so none is lost to another.

Statuses (IoT Hub's): 400 for malformed or too deep (its 400004 "ArgumentInvalid"), 413 for too large (its
413 "RequestEntityTooLarge"; IoT Hub itself answers a reported document over 32 KB with 403100, a quota
error, but 413 says what happened and SDKs treat every status >= 300 alike).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from edgehub.core import Identity, TwinError
from edgehub.core.refusals import RefusalReason
from edgehub.store import Store

__all__ = [
    "DEFAULT_TWIN_LIMITS",
    "TwinLimits",
    "TwinStore",
    "check_patch",
    "merge_diff",
    "merged",
    "parse_reported_patch",
]

BAD_REQUEST = 400
TOO_LARGE = 413
_TWIN = "twin/"
_MAX_SAFE_INT = 2**52  # IoT Hub's bound on twin integers (a JavaScript double holds them exactly)
# A JSON string (escapes skipped whole), matched possessively: linear, no backtracking, no recursion.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_STEP = {"{": 1, "[": 1, "}": -1, "]": -1}


@dataclass(frozen=True, slots=True, kw_only=True)
class TwinLimits:
    """IoT Hub's twin limits (32 KB per patch and reported section, depth 10, keys of 1 KB) and how many twins
    stay in memory. (The desired section has no writer in the hub yet; its 32 KB goes with that writer.)"""

    max_patch_bytes: int = 32 * 1024
    max_reported_bytes: int = 32 * 1024
    max_depth: int = 10
    max_key_bytes: int = 1024
    max_keys: int = 2048
    max_cached: int = 1024

    def __post_init__(self) -> None:
        if min(self.max_patch_bytes, self.max_reported_bytes, self.max_key_bytes) < 1:
            raise ValueError("twin byte limits must be positive")
        # json.loads and the merge recurse once per level: keep far below Python's recursion limit.
        if not 1 <= self.max_depth <= 100:
            raise ValueError("max_depth must be within 1..100")
        if self.max_keys < 1 or self.max_cached < 1:
            raise ValueError("max_keys and max_cached must be positive")


DEFAULT_TWIN_LIMITS = TwinLimits()


def _invalid(message: str) -> TwinError:
    return TwinError(message, status=BAD_REQUEST, refusal=RefusalReason.TWIN_INVALID)


def _nesting(text: str) -> int:
    """Deepest nesting of brackets outside strings in ``text``, in linear time and without recursion (1 for
    ``{}``). For text that is not JSON it may count more than a parser would reach, never less: a parser stops
    at the first unterminated string, and everything before it is counted as the parser sees it."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(_STEP[c] for c in brackets), default=0)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_reported_patch(raw: bytes, limits: TwinLimits = DEFAULT_TWIN_LIMITS) -> dict[str, Any]:
    """The reported-properties patch in ``raw`` (empty: ``{}``); raises ``TwinError`` only. See the module
    docstring for the checks and their order."""
    if len(raw) > limits.max_patch_bytes:
        raise TwinError(
            f"twin patch of {len(raw)} bytes is over {limits.max_patch_bytes}",
            status=TOO_LARGE,
            refusal=RefusalReason.TWIN_TOO_LARGE,
        )
    if not raw:
        return {}
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise _invalid("twin patch is not UTF-8") from exc
    depth = _nesting(text) - 1  # levels below the patch's own object
    if depth > limits.max_depth:
        raise TwinError(
            f"twin patch nests {depth} levels, over {limits.max_depth}",
            status=BAD_REQUEST,
            refusal=RefusalReason.TWIN_TOO_DEEP,
        )
    try:
        patch = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:  # JSONDecodeError, a number int() refuses, NaN/Infinity
        raise _invalid(f"twin patch is not JSON: {str(exc)[:100]}") from exc
    if not isinstance(patch, dict):
        raise _invalid("a reported patch is a JSON object")
    check_patch(patch, limits)
    return patch


def _text_ok(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (``json.loads`` turns a ``\\ud800`` escape into a lone
    surrogate, which cannot be)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_patch(patch: Mapping[str, Any], limits: TwinLimits = DEFAULT_TWIN_LIMITS) -> None:
    """Raise ``TwinError`` unless ``patch`` is a twin patch within ``limits`` (depth, key count and length, JSON
    values). Walks with a stack, not recursion, so a deep ``Mapping`` from a caller costs no ``RecursionError``."""
    keys = 0
    stack: list[tuple[Any, int]] = [(patch, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict) or (depth == 0 and isinstance(node, Mapping)):
            items: Any = node.items()
        elif isinstance(node, list):
            items = ((None, v) for v in node)
        else:
            raise _invalid(f"twin value of type {type(node).__name__} is not JSON")
        if depth > limits.max_depth:
            raise TwinError(
                f"twin patch nests over {limits.max_depth} levels",
                status=BAD_REQUEST,
                refusal=RefusalReason.TWIN_TOO_DEEP,
            )
        for key, value in items:
            if key is not None:
                keys += 1
                if keys > limits.max_keys:
                    raise _invalid(f"twin patch has over {limits.max_keys} keys")
                if not isinstance(key, str) or not _text_ok(key):
                    raise _invalid("twin keys are UTF-8 text")
                if len(key) > limits.max_key_bytes // 4 and len(key.encode()) > limits.max_key_bytes:
                    raise _invalid(f"twin key {key[:20]!r}... is over {limits.max_key_bytes} bytes")
                if depth and key.startswith("$"):
                    raise _invalid(f"twin key {key[:20]!r}: $ names are the hub's")
            if value is None or isinstance(value, bool | float):
                if isinstance(value, float) and value - value != 0:  # NaN or infinity
                    raise _invalid("twin numbers are finite")
            elif isinstance(value, int):
                if not -_MAX_SAFE_INT <= value < _MAX_SAFE_INT:
                    raise _invalid(f"twin integers are within ±2**52 ({key!r})")
            elif isinstance(value, str):
                if not _text_ok(value):
                    raise _invalid("twin strings are UTF-8 text")
            else:
                stack.append((value, depth + 1))


def merged(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """JSON merge patch as twins use it (null deletes, objects merge, anything else replaces), into a new
    document: ``target`` is left as it is, and only the objects on the patch's paths are copied (the cached twin
    stays intact when the result is refused). Recursion is bounded by the patch's checked depth."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            base = out.get(key)
            out[key] = merged(base if isinstance(base, dict) else {}, value)
        else:
            out[key] = json.loads(json.dumps(value)) if isinstance(value, list) else value
    return out


def merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns ``old`` into ``new`` (``merged(old, merge_diff(old, new)) == new``): removed keys
    are null, changed objects are diffed, anything else changed is given whole. Recursion is bounded by the
    documents' checked depth."""
    out: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key, _ABSENT)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_diff(before, value)
            if inner:
                out[key] = inner
        elif before is _ABSENT or before != value or type(before) is not type(value):
            out[key] = value
    return out


_ABSENT = object()


def _size(doc: Mapping[str, Any]) -> int:
    """A document's size as IoT Hub counts it, near enough: its compact JSON in UTF-8 (a lone surrogate left by
    an older hub's ``\\ud800`` counts as its three bytes)."""
    return len(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


class TwinStore:
    """Twins over ``store``'s metadata with an LRU of ``limits.max_cached`` in memory; see the module docstring."""

    def __init__(self, store: Store, limits: TwinLimits = DEFAULT_TWIN_LIMITS) -> None:
        self._store = store
        self.limits = limits
        self._cache: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, identity: Identity) -> dict[str, Any]:
        """The identity's twin; the caller must not change it (it is the cached one)."""
        twin = self._cache.get(identity.id)
        if twin is not None:
            self._cache.move_to_end(identity.id)
            return twin
        raw = self._store.get_metadata(_TWIN + identity.id)
        twin = {"desired": {"$version": 1}, "reported": {"$version": 1}} if raw is None else json.loads(raw)
        self._remember(identity.id, twin)
        return twin

    def _remember(self, key: str, twin: dict[str, Any]) -> None:
        self._cache[key] = twin
        self._cache.move_to_end(key)
        while len(self._cache) > self.limits.max_cached:
            self._cache.popitem(last=False)

    async def update_reported(self, identity: Identity, patch: Mapping[str, Any]) -> int:
        """Merge a checked ``patch`` into the reported properties and write the twin durably; the new version.
        Raises ``TwinError`` (413) when the merged document would be over ``max_reported_bytes``."""
        twin = self.get(identity)
        reported = merged(twin["reported"], {k: v for k, v in patch.items() if not k.startswith("$")})
        reported["$version"] = int(twin["reported"].get("$version", 1)) + 1
        size = _size(reported)
        if size > self.limits.max_reported_bytes:
            raise TwinError(
                f"reported properties would be {size} bytes, over {self.limits.max_reported_bytes}",
                status=TOO_LARGE,
                refusal=RefusalReason.TWIN_TOO_LARGE,
            )
        new = {"desired": twin["desired"], "reported": reported}
        # Written as ASCII JSON (the escapes keep any text writable), once per patch.
        await self._store.put_metadata(_TWIN + identity.id, json.dumps(new, separators=(",", ":")).encode())
        self._remember(identity.id, new)
        return int(reported["$version"])
