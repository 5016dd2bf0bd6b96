"""Hypothesis strategies for the route language: grammar-shaped conditions and routes (mostly valid: literals,
properties, system properties, ``$body`` paths, functions, every operator, nesting), random text, and messages
with bodies of every kind (JSON and not, deep, huge numbers, other encodings)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from edgehub import Message

__all__ = ["SEED_ROUTES", "conditions", "deep_conditions", "messages", "route_texts", "routes"]

_NAMES = ["a", "temp", "Level", "n", "nothing", "temp-1", "x.y", "TRUE", "missing", "é"]
_SYS = ["$connectionDeviceId", "$contentType", "$messageId", "$CORRELATIONID", "$userId", "$nope", "$cid"]
_BODY_PATHS = ["$body.t", "$body.a.b", "$body.arr[0]", "$body.arr[99]", "$BODY.n", "$body.s", "$body.deep.x"]
_FUNCTIONS = {
    "abs": 1,
    "exp": 1,
    "power": 2,
    "square": 1,
    "ceiling": 1,
    "floor": 1,
    "sign": 1,
    "sqrt": 1,
    "as_number": 1,
    "is_bool": 1,
    "is_defined": 1,
    "is_null": 1,
    "is_number": 1,
    "is_string": 1,
    "concat": 3,
    "length": 1,
    "lower": 1,
    "upper": 1,
    "substring": 3,
    "index_of": 2,
    "starts_with": 2,
    "ends_with": 2,
    "contains": 2,
    "twin_change_includes": 1,
    "nosuchfunction": 1,
}
_BINARY = ["AND", "OR", "and", "=", "!=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "||", "??"]
_NUMBERS = ["0", "1", "-3", "2.5", "1e308", "1e309", "-1e400", "0x1F", ".5", "1" * 400, "0x" + "f" * 300, "0X0"]
_STRINGS = ["'x'", '"x"', "''", "'it\\'s'", "'\\u0041'", "'\\uD800'", "'é'", "'hot'", "'1e5'", "' 42 '"]


def _literal() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(_NUMBERS),
        st.sampled_from(_STRINGS),
        st.sampled_from(["true", "false", "null", "undefined"]),
        st.floats(allow_nan=False).map(repr).filter(lambda r: "inf" not in r),
        st.text(st.characters(codec="utf-8", exclude_characters="'\\"), max_size=8).map(lambda t: f"'{t}'"),
    )


def _leaf() -> st.SearchStrategy[str]:
    return st.one_of(
        _literal(),
        st.sampled_from(_NAMES),
        st.sampled_from(_SYS),
        st.sampled_from(_SYS).map(lambda s: "{" + s + "}"),
        st.sampled_from(_BODY_PATHS),
        st.sampled_from(_BODY_PATHS).map(lambda s: "{" + s + "}"),
    )


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(_BINARY), children).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        st.tuples(st.sampled_from(["NOT ", "-", "not "]), children).map(lambda t: t[0] + t[1]),
        children.map(lambda c: f"({c})"),
        st.tuples(st.sampled_from(sorted(_FUNCTIONS)), st.lists(children, min_size=0, max_size=3)).map(
            lambda t: f"{t[0]}({', '.join(t[1])})"
        ),
    )


def conditions() -> st.SearchStrategy[str]:
    """Conditions shaped by the grammar: many compile, many are type errors, a few do not parse."""
    return st.recursive(_leaf(), _extend, max_leaves=12)


_SOURCES = ["/*", "/messages", "/messages/*", "/messages/modules/m1/outputs/o1", "/twinChangeNotifications", "/x"]
_SINKS = [
    "$upstream",
    "$UPSTREAM",
    "$downstream",
    'BrokeredEndpoint("/modules/m2/inputs/in1")',
    "brokeredendpoint('/modules/m2/inputs/in1')",
    'BrokeredEndpoint("/modules/m2")',
    'Other("/modules/m2/inputs/in1")',
]


@st.composite
def routes(draw: st.DrawFn) -> str:
    select = draw(st.sampled_from(["", "SELECT * ", "select * "]))
    where = draw(st.none() | conditions())
    clause = f" WHERE {where}" if where is not None else ""
    return f"{select}FROM {draw(st.sampled_from(_SOURCES))}{clause} INTO {draw(st.sampled_from(_SINKS))}"


# Valid routes of every feature, for fuzzers that mutate examples (bench.fuzz under atheris).
SEED_ROUTES = [
    "FROM /messages/* WHERE $body.t > 30 AND starts_with($connectionDeviceId, 'gw') INTO $upstream",
    "SELECT * FROM /messages/modules/m1/outputs/o1 WHERE as_number(level) >= 3 "
    'INTO BrokeredEndpoint("/modules/m2/inputs/in1")',
    "FROM /messages WHERE (a = 'x' OR NOT is_defined(b)) AND length(concat(a, 'y')) <> 2 INTO $upstream",
    "FROM /twinChangeNotifications WHERE twin_change_includes('properties.reported.fw') INTO $upstream",
    "FROM /* WHERE {$body.arr[0]} ?? 1 = -2.5e3 / 0x1F % 2 INTO $upstream",
]

_TOKENS = ["FROM", "WHERE", "INTO", "SELECT", "*", "/", "(", ")", "'", '"', ",", "{", "}", "$body.", "/*", "*/", "\n"]


@st.composite
def deep_conditions(draw: st.DrawFn) -> str:
    """Nesting of any depth, in each of the shapes that nest: parentheses, unary operators, calls and chains."""
    n = draw(st.integers(1, 3_000))
    shape = draw(st.sampled_from(["parens", "not", "minus", "call", "chain"]))
    if shape == "parens":
        return "(" * n + "true" + ")" * n
    if shape == "not":
        return "NOT " * n + "true"
    if shape == "minus":
        return "- " * n + "1 = 1"
    if shape == "call":
        return "abs(" * n + "1" + ")" * n + " > 0"
    return " OR ".join(["a = 'x'"] * min(n, 400))  # past the limit already; longer only costs tokenizing


def route_texts() -> st.SearchStrategy[str]:
    """Text: arbitrary, sequences of the language's own tokens and fragments (closer to a parser's edges), and
    deep nesting."""
    return st.one_of(
        deep_conditions(),
        st.text(max_size=80),
        st.lists(st.one_of(st.sampled_from(_TOKENS), _leaf(), st.sampled_from(_BINARY)), max_size=20).map(" ".join),
        routes().map(lambda r: r[: len(r) // 2]),
    )


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(-(10**400), 10**400),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=10),
    )
    return st.recursive(
        scalars,
        lambda c: st.one_of(
            st.lists(c, max_size=3),
            st.dictionaries(st.sampled_from(["t", "a", "b", "arr", "n", "s", "deep", "x"]), c, max_size=4),
        ),
        max_leaves=10,
    )


_JSON = {"contentType": "application/json", "contentEncoding": "utf-8"}


@st.composite
def messages(draw: st.DrawFn) -> Message:
    """A message whose body is JSON (UTF-8, 16 or 32), deep JSON, non-JSON or bytes, with random properties."""
    kind = draw(st.sampled_from(["json", "json", "deep", "bytes", "utf16", "text"]))
    system = dict(_JSON)
    if kind == "json":
        body = json.dumps(draw(_json_values())).encode()
    elif kind == "deep":
        depth = draw(st.sampled_from([50, 5_000, 100_000]))
        body = b'{"deep": ' + b"[" * depth + b"]" * depth + b', "t": 1}'
    elif kind == "utf16":
        body = json.dumps(draw(_json_values())).encode("utf-16")
        system["contentEncoding"] = draw(st.sampled_from(["utf-16", "utf-8", "UTF-32"]))
    elif kind == "text":
        body = draw(st.text(max_size=40)).encode("utf-8", "surrogatepass")
    else:
        body = draw(st.binary(max_size=40))
    if draw(st.booleans()):
        system = {}
    names = st.sampled_from([*_NAMES, "$body.t", "$cid", "A"])
    props = draw(st.dictionaries(names, st.none() | st.text(max_size=8), max_size=4))
    system.update(
        draw(
            st.dictionaries(
                st.sampled_from(
                    ["connectionDeviceId", "messageId", "cid", "userId", "messageType", "connectionModuleId"]
                ),
                st.text(max_size=8),
                max_size=3,
            )
        )
    )
    return Message(body, props, system)
