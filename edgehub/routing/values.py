"""What a compiled condition works on: runtime values, three-valued verdicts, the per-message context, and the
operators and property readers the compiler builds closures from.

Runtime values: ``float`` (every number), ``str``, ``bool``, ``None`` (null; also a property present with a
null value) and ``UNDEF``. Body values are JSON scalars mapped the same way (integers become floats; objects
and arrays are ``UNDEF``). NaN never escapes an operator: it becomes ``UNDEF``. The static type names
(``NUMBER`` ... ``ANY``) live here too, beside the values they describe.

Invariants: nothing here raises on any message (the operators and readers return ``UNDEF`` or null instead);
an ``EvalContext`` parses the body at most once, however many routes read it.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable
from enum import Enum
from typing import Any

from edgehub.core import Message, SystemProperty

__all__ = [
    "ANY",
    "BODY_PATH",
    "BOOL",
    "FAST_OPS",
    "NULL",
    "NUMBER",
    "STRING",
    "UNDEF",
    "UNDEFINED",
    "EvalContext",
    "Fn",
    "Tri",
    "arithmetic",
    "body_query",
    "body_segments",
    "comparison",
    "sys_getter",
    "to_tri",
]


class _Undefined:
    __slots__ = ()

    def __repr__(self) -> str:
        return "undefined"


UNDEF: Any = _Undefined()
_UNPARSED: Any = object()


class Tri(Enum):
    """A condition's verdict. A route matches only on TRUE."""

    TRUE = "TRUE"
    FALSE = "FALSE"
    UNDEFINED = "UNDEFINED"

    def __str__(self) -> str:
        return self.value


def to_tri(value: object) -> Tri:
    """A condition's value as a verdict: true is TRUE; false and null are FALSE; anything else is UNDEFINED."""
    if value is True:
        return Tri.TRUE
    if value is False or value is None:
        return Tri.FALSE
    return Tri.UNDEFINED


_JSON_ENCODINGS = {"utf-8": "utf-8", "utf-16": "utf-16", "utf-32": "utf-32"}


class EvalContext:
    """What the closures read of one message; built once per message and shared by every route."""

    __slots__ = ("_body", "_sys", "_twin", "message", "props")

    def __init__(self, message: Message) -> None:
        self.message = message
        props = message.properties
        # Property names are case-insensitive; the first spelling wins if two differ only in case.
        lowered: dict[str, str | None] = {}
        for k, v in props.items():
            lowered.setdefault(k.lower(), v)
        self.props = lowered
        self._sys: dict[str, str] | None = None
        self._body: Any = _UNPARSED
        self._twin: Any = _UNPARSED

    def sys(self, lname: str) -> Any:
        if self._sys is None:
            self._sys = {k.lower(): v for k, v in self.message.system_properties.items()}
        return self._sys.get(lname, UNDEF)

    def body(self) -> Any:
        """The parsed JSON body, or UNDEF unless contentType is application/json and the encoding is UTF-*."""
        if self._body is _UNPARSED:
            self._body = UNDEF
            sp = self.message.system_properties
            ctype = sp.get("contentType")
            encoding = _JSON_ENCODINGS.get((sp.get("contentEncoding") or "").strip().lower())
            if ctype is not None and ctype.strip().lower() == "application/json" and encoding:
                try:
                    self._body = json.loads(self.message.body.decode(encoding))
                except (UnicodeDecodeError, ValueError, RecursionError):
                    self._body = UNDEF
        return self._body

    def twin_body(self) -> Any:
        """The body as JSON for twin change notifications (UTF-8, whatever the content type), or UNDEF."""
        if self._twin is _UNPARSED:
            try:
                self._twin = json.loads(self.message.body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                self._twin = UNDEF
        return self._twin


Fn = Callable[[EvalContext], Any]

# The heads store system properties under these canonical names, so a route's name (any case) is mapped to
# its canonical spelling once, at compile time; unknown names fall back to a case-insensitive lookup.
_CANONICAL_SYS = {p.value.lower(): p.value for p in SystemProperty}


def sys_getter(lname: str) -> Fn:
    canonical = _CANONICAL_SYS.get(lname)
    if canonical is None:
        return lambda ctx: ctx.sys(lname)

    def get(ctx: EvalContext) -> Any:
        v = ctx.message.system_properties.get(canonical, UNDEF)
        return ctx.sys(lname) if v is UNDEF else v

    return get


NUMBER, STRING, BOOL, NULL, UNDEFINED, ANY = "number", "string", "bool", "null", "undefined", "any"


def _scalar(value: Any) -> Any:
    """A JSON value as a runtime value."""
    if value is None or value is True or value is False or type(value) is str:
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:  # a JSON integer beyond the double range is an infinity, as IEEE parses it
            return math.inf if value > 0 else -math.inf
    if type(value) is float:
        return value if value == value else UNDEF
    return UNDEF  # objects and arrays


# ---------------------------------------------------------------- operators


def arithmetic(op: str) -> Callable[[Any, Any], Any]:
    def add(a: float, b: float) -> float:
        return a + b

    def sub(a: float, b: float) -> float:
        return a - b

    def mul(a: float, b: float) -> float:
        return a * b

    def div(a: float, b: float) -> float:
        if b == 0.0:
            if a == 0.0 or a != a:
                return math.nan
            return math.copysign(math.inf, a) * math.copysign(1.0, b)
        return a / b

    def mod(a: float, b: float) -> float:
        try:
            return math.fmod(a, b)  # C fmod: the sign of the dividend
        except ValueError:
            return math.nan  # x % 0, inf % y

    impl = {"+": add, "-": sub, "*": mul, "/": div, "%": mod}[op]

    def apply(a: Any, b: Any) -> Any:
        if type(a) is not float or type(b) is not float:
            return UNDEF
        try:
            r = impl(a, b)
        except OverflowError:
            return math.inf
        return UNDEF if r != r else r

    return apply


def comparison(op: str, *, dynamic: bool = False) -> Callable[[Any, Any], Any]:
    """The operator ``op`` over runtime values. ``dynamic``: an operand is a body value (static type any).

    Values of different types are unequal (``=`` FALSE, ``<>`` TRUE) when they meet through a body value, and a
    body value's null is one more JSON type: ``$body.t <> null`` (a number) is TRUE, as in Azure IoT Edge.
    Otherwise a null against a number, string or bool is undefined (Azure's Null operators), and null = null.
    """
    cmp: Callable[[Any, Any], bool] = {
        "=": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
        "<>": lambda a, b: a != b,
        "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b,
    }[op]
    equality = op in ("=", "!=", "<>")
    eq_result_for_mismatch = op == "="

    def apply(a: Any, b: Any) -> Any:
        if a is UNDEF or b is UNDEF:
            return UNDEF
        if a is None or b is None:
            if a is None and b is None and equality:
                return eq_result_for_mismatch
            return (not eq_result_for_mismatch) if dynamic and equality else UNDEF
        if type(a) is not type(b):
            # Only body values get here (static types agree otherwise): different JSON types are unequal.
            return (not eq_result_for_mismatch) if equality else UNDEF
        return cmp(a, b)

    return apply


FAST_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


# ---------------------------------------------------------------- property readers

# A body path's names hold any character but '.', '[', ']' and white space (Azure: `$body.Welcome!.x`,
# `$body.I'mnotusingspaces%1.es`); an index is digits in brackets. `[]`, slices and quoted keys do not match.
BODY_PATH = re.compile(r"^[^.\[\]\s]+(?:\.[^.\[\]\s]+|\[[0-9]+\])*$")
_BODY_SEGMENT = re.compile(r"\.?([^.\[\]]+)|\[([0-9]+)\]")


def body_segments(path: str) -> tuple[str | int, ...]:
    return tuple(m.group(1) if m.group(1) is not None else int(m.group(2)) for m in _BODY_SEGMENT.finditer(path))


def body_query(segments: tuple[str | int, ...], app_name: str | None = None) -> Fn:
    """A closure for ``$body.path``; with ``app_name``, an application property of that name wins.

    One closure per query (not a property check calling a query calling ``ctx.body()``): body queries are
    the most common conditions, and each Python call costs as much as the lookup it makes.
    """

    def query(ctx: EvalContext) -> Any:
        if app_name is not None:
            v = ctx.props.get(app_name, UNDEF)
            if v is not UNDEF:
                return v
        # EvalContext's own slot, read here in its module: a call to ctx.body() per query would cost as much as
        # the lookup (see above); the closure falls back to it while the body is unparsed.
        cur = ctx._body
        if cur is _UNPARSED:
            cur = ctx.body()
        if cur is UNDEF:
            return UNDEF
        for seg in segments:
            if type(seg) is int:
                if type(cur) is list and seg < len(cur):
                    cur = cur[seg]
                else:
                    return None  # a path that is not there is null
            elif type(cur) is dict and seg in cur:
                cur = cur[seg]
            else:
                return None
        return _scalar(cur)

    return query
