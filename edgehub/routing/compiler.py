"""Static type checking and compilation of conditions to Python closures over three-valued logic. No eval.

The runtime values, the context and the operators are in ``edgehub.routing.values``; the built-in functions
in ``edgehub.routing.functions``. This module type-checks the AST and wires those pieces into one closure.

Static types: number, string, bool, null, undefined, and any (a body value). A binary operator needs both
operands of one static type. A body value fits every type; a literal ``null`` or ``undefined`` fits a bool and
a comparison, but an operator or function that needs a number or a string refuses it (``3 + undefined``,
``lower(null)``: compile errors, as in Azure IoT Edge's type checker). Each problem is collected with its
position, and all of them are reported together.

``null`` in the logical operators follows Azure's ``Null`` type: ``null AND x`` is null, ``null OR x`` is x,
``null OR null`` is null (so ``(null AND true) = null`` is TRUE); a condition whose value is null is FALSE.

Invariants: a compiled closure never raises on any message; the same message gives the same verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgehub.routing import ast
from edgehub.routing.errors import Problem
from edgehub.routing.functions import BUILTINS, concat
from edgehub.routing.values import (
    ANY,
    BODY_PATH,
    BOOL,
    FAST_OPS,
    NULL,
    NUMBER,
    STRING,
    UNDEF,
    UNDEFINED,
    EvalContext,
    Fn,
    Tri,
    arithmetic,
    body_query,
    body_segments,
    comparison,
    sys_getter,
    to_tri,
)

__all__ = ["UNDEF", "CompiledExpr", "EvalContext", "Tri", "compile_expr", "to_tri"]

_FLEX = frozenset({ANY, NULL, UNDEFINED})  # fit either side of a comparison


@dataclass(frozen=True, slots=True)
class CompiledExpr:
    type: str
    fn: Fn


def _fits(actual: str, allowed: tuple[str, ...]) -> bool:
    """Whether a value of static type ``actual`` may stand where ``allowed`` types are wanted."""
    if actual == ANY or actual in allowed:
        return True
    # null and undefined stand for a bool (three-valued logic), never for a number or a string.
    return actual in (NULL, UNDEFINED) and BOOL in allowed


TWIN_CHANGE_INCLUDES = "twin_change_includes"
TWIN_SOURCE = "/twinchangenotifications"
_TWIN_PREFIXES = ("properties.reported.", "properties.desired.", "tags.")


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
            if not BODY_PATH.match(path):
                self.error(
                    node.span,
                    f"unsupported body query {name!r}: use names and [index] (no [], slices or quoted keys)",
                )
                return CompiledExpr(ANY, lambda ctx: UNDEF)
            # {$body.x} skips the application-property step; $body.x lets a property of that name win.
            body = body_query(body_segments(path), None if node.escaped else lname)
        if node.escaped:
            if body is not None:
                return CompiledExpr(ANY, body)
            return CompiledExpr(STRING, sys_getter(lname[1:]))
        if body is not None:
            return CompiledExpr(ANY, body)
        sys_get = sys_getter(lname[1:])

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
        if not path.startswith(_TWIN_PREFIXES) or not BODY_PATH.match(path):
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
            if NULL in (lt, rt):
                return self._logical_null(op, left, right)
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
            arith = arithmetic(op)
            return CompiledExpr(NUMBER, lambda ctx: arith(lf(ctx), rf(ctx)))
        if op == "||":
            if not (_fits(lt, (STRING,)) and _fits(rt, (STRING,))):
                self.error(node.span, f"operator '||' needs strings, not {lt} and {rt}")
            return CompiledExpr(STRING, lambda ctx: concat(lf(ctx), rf(ctx)))
        if not (lt == rt or lt in _FLEX or rt in _FLEX):
            self.error(node.span, f"operator '{op}' needs operands of one type, not {lt} and {rt}")
        if op == "??":
            result_type = rt if lt in (NULL, UNDEFINED) else lt

            def coalesce(ctx: EvalContext) -> Any:
                v = lf(ctx)
                return rf(ctx) if v is UNDEF else v

            return CompiledExpr(result_type, coalesce)
        compare = comparison(op, dynamic=ANY in (lt, rt))
        # The common cases, anything against a literal, get one closure and a C-level operator when the
        # value has the literal's type; the general compare handles undefined, null and body type mismatches.
        if isinstance(node.right, ast.StringLit | ast.NumberLit | ast.BoolLit):
            lit: Any = node.right.value
            lit_type, fast = type(lit), FAST_OPS[op]
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

    @staticmethod
    def _logical_null(op: str, left: CompiledExpr, right: CompiledExpr) -> CompiledExpr:
        """AND/OR with a null operand, decided by static types as Azure's ``Null`` operators are."""
        if op == "AND" or left.type == right.type == NULL:
            return CompiledExpr(NULL, lambda ctx: None)
        return right if left.type == NULL else left  # null OR x is x


def _span_of(node: ast.Expr) -> ast.Span:
    return node.span


def compile_expr(node: ast.Expr, *, source: str | None = None) -> tuple[CompiledExpr, list[Problem]]:
    """Type-check and compile ``node``; ``source`` is the route's source (for twin_change_includes)."""
    compiler = _Compiler(source)
    compiled = compiler.compile(node)
    return compiled, compiler.problems
