"""Static type checking and compilation of conditions to Python closures over three-valued logic. No eval.

Runtime values: ``float`` (every number), ``str``, ``bool``, ``None`` (null; also a property present with a
null value) and ``UNDEF``. Body values are JSON scalars mapped the same way (integers become floats; objects
and arrays are ``UNDEF``). NaN never escapes an operator: it becomes ``UNDEF``.

Static types: number, string, bool, null, undefined, and any (a body value). A binary operator needs both
operands of one static type; any, null and undefined fit every type. Each problem is collected with its
position, and all of them are reported together.

Invariants: a compiled closure never raises on any message; the same message gives the same verdict.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from edgehub.core import Message, SystemProperty
from edgehub.routing import ast
from edgehub.routing.errors import Problem

__all__ = ["UNDEF", "CompiledExpr", "EvalContext", "Tri", "compile_expr", "to_tri"]


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


def _sys_getter(lname: str) -> Fn:
    canonical = _CANONICAL_SYS.get(lname)
    if canonical is None:
        return lambda ctx: ctx.sys(lname)

    def get(ctx: EvalContext) -> Any:
        v = ctx.message.system_properties.get(canonical, UNDEF)
        return ctx.sys(lname) if v is UNDEF else v

    return get


NUMBER, STRING, BOOL, NULL, UNDEFINED, ANY = "number", "string", "bool", "null", "undefined", "any"
_FLEX = frozenset({ANY, NULL, UNDEFINED})


@dataclass(frozen=True, slots=True)
class CompiledExpr:
    type: str
    fn: Fn


def _fits(actual: str, allowed: tuple[str, ...]) -> bool:
    return actual in _FLEX or actual in allowed


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


def _num(value: float) -> Any:
    return UNDEF if value != value else value


# ---------------------------------------------------------------- operators


def _arith(op: str) -> Callable[[Any, Any], Any]:
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


def _compare(op: str) -> Callable[[Any, Any], Any]:
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
            return UNDEF
        if type(a) is not type(b):
            # Only body values get here (static types agree otherwise): different JSON types are unequal.
            return (not eq_result_for_mismatch) if equality else UNDEF
        return cmp(a, b)

    return apply


_FAST_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


# ---------------------------------------------------------------- built-ins

_AS_NUMBER = re.compile(r"^\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$")


def _math1(f: Callable[[float], float]) -> Callable[..., Any]:
    def apply(x: Any) -> Any:
        if type(x) is not float:
            return UNDEF
        try:
            return _num(f(x))
        except OverflowError:
            return math.inf
        except ValueError:
            return UNDEF

    return apply


def _ceil_floor(f: Callable[[float], int]) -> Callable[[float], float]:
    def apply(x: float) -> float:
        return x if math.isinf(x) else float(f(x))

    return apply


def _sign(x: float) -> float:
    return 0.0 if x == 0 else math.copysign(1.0, x)


def _sqrt(x: float) -> float:
    if x < 0:
        raise ValueError("negative")
    return math.sqrt(x)


def _power(a: Any, b: Any) -> Any:
    if type(a) is not float or type(b) is not float:
        return UNDEF
    if a == 0.0 and b < 0:
        return math.inf
    try:
        return _num(math.pow(a, b))
    except OverflowError:
        return math.inf
    except ValueError:
        return UNDEF


def _as_number(x: Any) -> Any:
    if type(x) is float:
        return x
    if type(x) is str and _AS_NUMBER.match(x):
        return float(x)
    return UNDEF


def _concat(*args: Any) -> Any:
    parts = []
    for a in args:
        if a is None:
            continue  # a null string concatenates as empty
        if type(a) is not str:
            return UNDEF
        parts.append(a)
    return "".join(parts)


def _str1(f: Callable[[str], Any]) -> Callable[..., Any]:
    def apply(s: Any) -> Any:
        return f(s) if type(s) is str else UNDEF

    return apply


def _str2(f: Callable[[str, str], Any]) -> Callable[..., Any]:
    def apply(s: Any, t: Any) -> Any:
        return f(s, t) if type(s) is str and type(t) is str else UNDEF

    return apply


def _substring(s: Any, start: Any, length: Any = None) -> Any:
    if type(s) is not str or type(start) is not float or not math.isfinite(start):
        return UNDEF
    i = int(start)
    if i < 0 or i > len(s):
        return UNDEF
    if length is None:
        return s[i:]
    if type(length) is not float or not math.isfinite(length):
        return UNDEF
    n = int(length)
    if n < 0 or i + n > len(s):
        return UNDEF
    return s[i : i + n]


@dataclass(frozen=True, slots=True)
class _Builtin:
    params: tuple[tuple[str, ...], ...]  # allowed static types per parameter
    result: str
    impl: Callable[..., Any]
    min_args: int
    max_args: int | None  # None: varargs of the last parameter's types
    sees_undefined: bool = False  # is_* functions see UNDEF instead of propagating it


_N, _S, _ALL = (NUMBER,), (STRING,), (NUMBER, STRING, BOOL, NULL, UNDEFINED, ANY)
BUILTINS: dict[str, _Builtin] = {
    "abs": _Builtin((_N,), NUMBER, _math1(abs), 1, 1),
    "exp": _Builtin((_N,), NUMBER, _math1(math.exp), 1, 1),
    "power": _Builtin((_N, _N), NUMBER, _power, 2, 2),
    "square": _Builtin((_N,), NUMBER, _math1(lambda x: x * x), 1, 1),
    "ceiling": _Builtin((_N,), NUMBER, _math1(_ceil_floor(math.ceil)), 1, 1),
    "floor": _Builtin((_N,), NUMBER, _math1(_ceil_floor(math.floor)), 1, 1),
    "sign": _Builtin((_N,), NUMBER, _math1(_sign), 1, 1),
    "sqrt": _Builtin((_N,), NUMBER, _math1(_sqrt), 1, 1),
    "as_number": _Builtin(((NUMBER, STRING),), NUMBER, _as_number, 1, 1),
    "is_bool": _Builtin((_ALL,), BOOL, lambda x: type(x) is bool, 1, 1, True),
    "is_defined": _Builtin((_ALL,), BOOL, lambda x: x is not UNDEF, 1, 1, True),
    "is_null": _Builtin((_ALL,), BOOL, lambda x: x is None, 1, 1, True),
    "is_number": _Builtin((_ALL,), BOOL, lambda x: type(x) is float and math.isfinite(x), 1, 1, True),
    "is_string": _Builtin((_ALL,), BOOL, lambda x: type(x) is str, 1, 1, True),
    "concat": _Builtin((_S, _S), STRING, _concat, 2, None),
    "length": _Builtin((_S,), NUMBER, _str1(lambda s: float(len(s))), 1, 1),
    "lower": _Builtin((_S,), STRING, _str1(str.lower), 1, 1),
    "upper": _Builtin((_S,), STRING, _str1(str.upper), 1, 1),
    "substring": _Builtin((_S, _N, _N), STRING, _substring, 2, 3),
    "index_of": _Builtin((_S, _S), NUMBER, _str2(lambda s, f: float(s.find(f))), 2, 2),
    "starts_with": _Builtin((_S, _S), BOOL, _str2(str.startswith), 2, 2),
    "ends_with": _Builtin((_S, _S), BOOL, _str2(str.endswith), 2, 2),
    "contains": _Builtin((_S, _S), BOOL, _str2(lambda s, f: f in s), 2, 2),
}
TWIN_CHANGE_INCLUDES = "twin_change_includes"
TWIN_SOURCE = "/twinchangenotifications"
_TWIN_PREFIXES = ("properties.reported.", "properties.desired.", "tags.")
_BODY_PATH = re.compile(r"^[^.\[\]'\"*\s]+(?:\.[^.\[\]'\"*\s]+|\[[0-9]+\])*$")
_BODY_SEGMENT = re.compile(r"\.?([^.\[\]]+)|\[([0-9]+)\]")


def _body_segments(path: str) -> tuple[str | int, ...]:
    return tuple(m.group(1) if m.group(1) is not None else int(m.group(2)) for m in _BODY_SEGMENT.finditer(path))


def _body_query(segments: tuple[str | int, ...], app_name: str | None = None) -> Fn:
    """A closure for ``$body.path``; with ``app_name``, an application property of that name wins.

    One closure per query (not a property check calling a query calling ``ctx.body()``): body queries are
    the most common conditions, and each Python call costs as much as the lookup it makes.
    """

    def query(ctx: EvalContext) -> Any:
        if app_name is not None:
            v = ctx.props.get(app_name, UNDEF)
            if v is not UNDEF:
                return v
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


class _Compiler:
    def __init__(self, source: str | None) -> None:
        self.problems: list[Problem] = []
        self.source = source.lower().rstrip("/") if source is not None else None

    def error(self, span: ast.Span, message: str) -> None:
        self.problems.append(Problem(span.line, span.column, message, span.length))

    def compile(self, node: ast.Expr) -> CompiledExpr:
        match node:
            case ast.NumberLit(value=v):
                return CompiledExpr(NUMBER, lambda ctx: v)
            case ast.StringLit(value=s):
                return CompiledExpr(STRING, lambda ctx: s)
            case ast.BoolLit(value=b):
                return CompiledExpr(BOOL, lambda ctx: b)
            case ast.NullLit():
                return CompiledExpr(NULL, lambda ctx: None)
            case ast.UndefinedLit():
                return CompiledExpr(UNDEFINED, lambda ctx: UNDEF)
            case ast.Property(name=name):
                key = name.lower()
                return CompiledExpr(STRING, lambda ctx: ctx.props.get(key, UNDEF))
            case ast.SysProperty():
                return self._sys_property(node)
            case ast.Call():
                return self._call(node)
            case ast.Unary():
                return self._unary(node)
            case ast.Binary():
                return self._binary(node)
        raise TypeError(f"not an expression: {node!r}")

    def _sys_property(self, node: ast.SysProperty) -> CompiledExpr:
        name = node.name
        lname = name.lower()
        body: Fn | None = None
        if lname.startswith("$body."):
            path = name[len("$body.") :]
            if not _BODY_PATH.match(path):
                self.error(
                    node.span,
                    f"unsupported body query {name!r}: use names and [index] (no [], slices or quoted keys)",
                )
                return CompiledExpr(ANY, lambda ctx: UNDEF)
            # {$body.x} skips the application-property step; $body.x lets a property of that name win.
            body = _body_query(_body_segments(path), None if node.escaped else lname)
        if node.escaped:
            if body is not None:
                return CompiledExpr(ANY, body)
            return CompiledExpr(STRING, _sys_getter(lname[1:]))
        if body is not None:
            return CompiledExpr(ANY, body)
        sys_get = _sys_getter(lname[1:])

        def app_or_sys(ctx: EvalContext) -> Any:
            v = ctx.props.get(lname, UNDEF)
            return sys_get(ctx) if v is UNDEF else v

        return CompiledExpr(STRING, app_or_sys)

    def _call(self, node: ast.Call) -> CompiledExpr:
        lname = node.name.lower()
        if lname == TWIN_CHANGE_INCLUDES:
            return self._twin_change_includes(node)
        builtin = BUILTINS.get(lname)
        if builtin is None:
            self.error(node.span, f"unknown function {node.name!r}")
            for a in node.args:
                self.compile(a)
            return CompiledExpr(UNDEFINED, lambda ctx: UNDEF)
        n = len(node.args)
        if n < builtin.min_args or (builtin.max_args is not None and n > builtin.max_args):
            want = (
                f"{builtin.min_args} or more"
                if builtin.max_args is None
                else str(builtin.min_args)
                if builtin.min_args == builtin.max_args
                else f"{builtin.min_args} to {builtin.max_args}"
            )
            self.error(node.span, f"function {lname} takes {want} arguments, not {n}")
        args = [self.compile(a) for a in node.args]
        for i, (arg_node, arg) in enumerate(zip(node.args, args, strict=True)):
            allowed = builtin.params[min(i, len(builtin.params) - 1)]
            if not _fits(arg.type, allowed):
                self.error(
                    _span_of(arg_node),
                    f"argument {i + 1} of {lname} must be {' or '.join(allowed)}, not {arg.type}",
                )
        impl, fns = builtin.impl, tuple(a.fn for a in args)
        if builtin.sees_undefined and fns:
            f0 = fns[0]  # arity was checked: the is_* functions take exactly one argument
            return CompiledExpr(builtin.result, lambda ctx: impl(f0(ctx)))

        if len(fns) == 1:
            (g0,) = fns

            def call1(ctx: EvalContext) -> Any:
                v = g0(ctx)
                return UNDEF if v is UNDEF else impl(v)

            return CompiledExpr(builtin.result, call1)
        if len(fns) == 2:
            g0, g1 = fns

            def call2(ctx: EvalContext) -> Any:
                a = g0(ctx)
                if a is UNDEF:
                    return UNDEF
                b = g1(ctx)
                return UNDEF if b is UNDEF else impl(a, b)

            return CompiledExpr(builtin.result, call2)

        def call(ctx: EvalContext) -> Any:
            values = [f(ctx) for f in fns]
            for v in values:
                if v is UNDEF:
                    return UNDEF
            return impl(*values)

        return CompiledExpr(builtin.result, call)

    def _twin_change_includes(self, node: ast.Call) -> CompiledExpr:
        if self.source != TWIN_SOURCE:
            self.error(node.span, "twin_change_includes is only allowed in routes FROM /twinChangeNotifications")
        if len(node.args) != 1 or not isinstance(node.args[0], ast.StringLit):
            self.error(node.span, "twin_change_includes takes one string literal, the twin path")
            return CompiledExpr(BOOL, lambda ctx: UNDEF)
        path = node.args[0].value
        if not path.startswith(_TWIN_PREFIXES) or not _BODY_PATH.match(path):
            self.error(
                node.args[0].span,
                "twin path must start with properties.reported., properties.desired. or tags.",
            )
        segments = path.split(".")

        def includes(ctx: EvalContext) -> Any:
            cur = ctx.twin_body()
            if cur is UNDEF:
                return UNDEF
            for seg in segments:
                if type(cur) is not dict or seg not in cur:
                    return False
                cur = cur[seg]
            return True

        return CompiledExpr(BOOL, includes)

    def _unary(self, node: ast.Unary) -> CompiledExpr:
        operand = self.compile(node.operand)
        f = operand.fn
        if node.op == "-":
            if not _fits(operand.type, (NUMBER,)):
                self.error(node.span, f"operator '-' needs a number, not {operand.type}")

            def neg(ctx: EvalContext) -> Any:
                v = f(ctx)
                return -v if type(v) is float else UNDEF

            return CompiledExpr(NUMBER, neg)
        if not _fits(operand.type, (BOOL,)):
            self.error(node.span, f"operator NOT needs a bool, not {operand.type}")

        def not_(ctx: EvalContext) -> Any:
            v = f(ctx)
            if v is True:
                return False
            if v is False or v is None:
                return True  # NOT null is TRUE
            return UNDEF

        return CompiledExpr(BOOL, not_)

    def _binary(self, node: ast.Binary) -> CompiledExpr:
        left, right = self.compile(node.left), self.compile(node.right)
        op, lt, rt = node.op, left.type, right.type
        lf, rf = left.fn, right.fn
        if op in ("AND", "OR"):
            for side in (lt, rt):
                if not _fits(side, (BOOL,)):
                    self.error(node.span, f"operator {op} needs bools, not {lt} and {rt}")
                    break
            if op == "AND":

                def and_(ctx: EvalContext) -> Any:
                    a = lf(ctx)
                    if a is False or a is None:  # FALSE wins; null is false
                        return False
                    b = rf(ctx)
                    if b is False or b is None:
                        return False
                    return True if a is True and b is True else UNDEF

                return CompiledExpr(BOOL, and_)

            def or_(ctx: EvalContext) -> Any:
                a = lf(ctx)
                if a is True:
                    return True
                b = rf(ctx)
                if b is True:
                    return True
                a_false = a is False or a is None
                return False if a_false and (b is False or b is None) else UNDEF

            return CompiledExpr(BOOL, or_)
        if op in ("+", "-", "*", "/", "%"):
            if not (_fits(lt, (NUMBER,)) and _fits(rt, (NUMBER,))):
                self.error(node.span, f"operator '{op}' needs numbers, not {lt} and {rt}")
            arith = _arith(op)
            return CompiledExpr(NUMBER, lambda ctx: arith(lf(ctx), rf(ctx)))
        if op == "||":
            if not (_fits(lt, (STRING,)) and _fits(rt, (STRING,))):
                self.error(node.span, f"operator '||' needs strings, not {lt} and {rt}")
            return CompiledExpr(STRING, lambda ctx: _concat(lf(ctx), rf(ctx)))
        if not (lt == rt or lt in _FLEX or rt in _FLEX):
            self.error(node.span, f"operator '{op}' needs operands of one type, not {lt} and {rt}")
        if op == "??":
            result_type = rt if lt in (NULL, UNDEFINED) else lt

            def coalesce(ctx: EvalContext) -> Any:
                v = lf(ctx)
                return rf(ctx) if v is UNDEF else v

            return CompiledExpr(result_type, coalesce)
        compare = _compare(op)
        # The common cases, anything against a literal, get one closure and a C-level operator when the
        # value has the literal's type; the general compare handles undefined, null and body type mismatches.
        if isinstance(node.right, ast.StringLit | ast.NumberLit | ast.BoolLit):
            lit: Any = node.right.value
            lit_type, fast = type(lit), _FAST_OPS[op]
            if isinstance(node.left, ast.Property):
                key = node.left.name.lower()

                def prop_vs_literal(ctx: EvalContext) -> Any:
                    a = ctx.props.get(key, UNDEF)
                    return fast(a, lit) if type(a) is lit_type else compare(a, lit)

                return CompiledExpr(BOOL, prop_vs_literal)

            def expr_vs_literal(ctx: EvalContext) -> Any:
                a = lf(ctx)
                return fast(a, lit) if type(a) is lit_type else compare(a, lit)

            return CompiledExpr(BOOL, expr_vs_literal)
        return CompiledExpr(BOOL, lambda ctx: compare(lf(ctx), rf(ctx)))


def _span_of(node: ast.Expr) -> ast.Span:
    return node.span


def compile_expr(node: ast.Expr, *, source: str | None = None) -> tuple[CompiledExpr, list[Problem]]:
    """Type-check and compile ``node``; ``source`` is the route's source (for twin_change_includes)."""
    compiler = _Compiler(source)
    compiled = compiler.compile(node)
    return compiled, compiler.problems
