"""The route language's syntax tree: frozen dataclasses, each carrying its ``Span`` (ignored by equality, so a
tree parsed from printed text equals the original) and a printer that writes text which parses back to an
equal tree."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = [
    "Binary",
    "BoolLit",
    "Call",
    "Expr",
    "FunctionSink",
    "NullLit",
    "NumberLit",
    "Property",
    "RouteAst",
    "Span",
    "StringLit",
    "SysProperty",
    "SystemSink",
    "Unary",
    "UndefinedLit",
    "to_text",
]


@dataclass(frozen=True, slots=True)
class Span:
    """Where a node stands: 1-based line and column of its first character, and its length in characters."""

    line: int = 1
    column: int = 1
    length: int = 1


_NOWHERE = Span()


@dataclass(frozen=True, slots=True)
class NumberLit:
    value: float
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class StringLit:
    value: str
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class BoolLit:
    value: bool
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class NullLit:
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class UndefinedLit:
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class Property:
    """An application property, by name (looked up case-insensitively)."""

    name: str
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class SysProperty:
    """``$name`` (``escaped=False``) or ``{$name}`` (``escaped=True``); ``name`` keeps its ``$``."""

    name: str
    escaped: bool = False
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: tuple[Expr, ...]
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "-" or "NOT"
    operand: Expr
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # upper-case for AND/OR; "<>" and "!=" are both kept as written
    left: Expr
    right: Expr
    span: Span = field(default=_NOWHERE, compare=False)  # the operator's span


Expr = NumberLit | StringLit | BoolLit | NullLit | UndefinedLit | Property | SysProperty | Call | Unary | Binary


@dataclass(frozen=True, slots=True)
class SystemSink:
    name: str  # as written, with its "$"
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class FunctionSink:
    function: str
    argument: str
    span: Span = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True, slots=True)
class RouteAst:
    source: str  # as written (path tokens joined)
    condition: Expr | None
    condition_text: str | None
    sink: SystemSink | FunctionSink
    span: Span = field(default=_NOWHERE, compare=False)


def _number_text(value: float) -> str:
    if math.isinf(value):
        return "1e999" if value > 0 else "-1e999"
    text = repr(value)
    return text if any(c in text for c in ".e") else text + ".0"


def _string_text(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def to_text(node: Expr | RouteAst) -> str:
    """Text that parses back to a tree equal to ``node`` (binary and unary operands are parenthesised)."""
    match node:
        case RouteAst():
            where = f" WHERE {to_text(node.condition)}" if node.condition is not None else ""
            sink = (
                node.sink.name
                if isinstance(node.sink, SystemSink)
                else f"{node.sink.function}({_string_text(node.sink.argument)})"
            )
            return f"FROM {node.source}{where} INTO {sink}"
        case NumberLit():
            return _number_text(node.value)
        case StringLit():
            return _string_text(node.value)
        case BoolLit():
            return "true" if node.value else "false"
        case NullLit():
            return "null"
        case UndefinedLit():
            return "undefined"
        case Property():
            return node.name
        case SysProperty():
            return "{" + node.name + "}" if node.escaped else node.name
        case Call():
            return f"{node.name}({', '.join(to_text(a) for a in node.args)})"
        case Unary():
            return f"{node.op} ({to_text(node.operand)})"
        case Binary():
            return f"({to_text(node.left)}) {node.op} ({to_text(node.right)})"
    raise TypeError(f"not a route node: {node!r}")
