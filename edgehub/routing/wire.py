"""A route's syntax tree as plain JSON values (lists, strings, numbers), and back: how a parsed route crosses a
process boundary, so a process that only compiles and runs routes never loads lark (~6 MB of a small gateway's
memory). The manifest check (``python -m edgehub.runtime.deployment.check``) parses; the serving hub gets the
trees, compiles them (``Router(specs, trees=...)``) and never parses.

A node is ``[kind, ...fields, line, column, length]`` (its span last). Numbers travel as their ``repr`` (a route
may hold ``1e999``, which JSON has no literal for). ``tree_from_wire`` trusts nothing: a value that is not a
well-formed tree, or one nested deeper than the parser allows (``MAX_WIRE_DEPTH``), is a ``ValueError`` naming
what is wrong, never a RecursionError. The tree it gives is then compiled and checked like any parsed one.
"""

from __future__ import annotations

from typing import Any

from edgehub.routing import ast

__all__ = ["MAX_WIRE_DEPTH", "route_from_wire", "route_to_wire"]

# The parser refuses trees deeper than 200 levels (edgehub.routing.parser.MAX_NESTING, not imported: it would load
# lark); a little room for the route's own levels.
MAX_WIRE_DEPTH = 210


def _span(s: ast.Span) -> list[int]:
    return [s.line, s.column, s.length]


def expr_to_wire(node: ast.Expr) -> list[Any]:
    match node:
        case ast.NumberLit():
            return ["num", repr(node.value), *_span(node.span)]
        case ast.StringLit():
            return ["str", node.value, *_span(node.span)]
        case ast.BoolLit():
            return ["bool", node.value, *_span(node.span)]
        case ast.NullLit():
            return ["null", *_span(node.span)]
        case ast.UndefinedLit():
            return ["undef", *_span(node.span)]
        case ast.Property():
            return ["prop", node.name, *_span(node.span)]
        case ast.SysProperty():
            return ["sys", node.name, node.escaped, *_span(node.span)]
        case ast.Call():
            return ["call", node.name, [expr_to_wire(a) for a in node.args], *_span(node.span)]
        case ast.Unary():
            return ["un", node.op, expr_to_wire(node.operand), *_span(node.span)]
        case ast.Binary():
            return ["bin", node.op, expr_to_wire(node.left), expr_to_wire(node.right), *_span(node.span)]
    raise TypeError(f"not a route expression: {node!r}")


def route_to_wire(tree: ast.RouteAst) -> dict[str, Any]:
    """``tree`` as JSON values."""
    sink = tree.sink
    sink_wire = (
        ["system", sink.name, *_span(sink.span)]
        if isinstance(sink, ast.SystemSink)
        else ["function", sink.function, sink.argument, *_span(sink.span)]
    )
    return {
        "source": tree.source,
        "condition": expr_to_wire(tree.condition) if tree.condition is not None else None,
        "conditionText": tree.condition_text,
        "sink": sink_wire,
        "span": _span(tree.span),
    }


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, not {type(v).__name__}")
    return v


def _span_of(fields: list[Any]) -> ast.Span:
    if len(fields) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in fields):
        raise ValueError("a span is three non-negative integers")
    return ast.Span(fields[0], fields[1], fields[2])


def _node(kind: str, fields: list[Any], n: int) -> tuple[list[Any], ast.Span]:
    """The ``n`` fields of a node of ``kind`` and its span (the three values after them)."""
    if len(fields) != n + 3:
        raise ValueError(f"a {kind!r} node has {n} fields and a span")
    return fields[:n], _span_of(fields[n:])


def expr_from_wire(value: Any, depth: int = 0) -> ast.Expr:
    """A tree from ``expr_to_wire``'s values; ``ValueError`` when it is not one."""
    if depth > MAX_WIRE_DEPTH:
        raise ValueError(f"nested deeper than {MAX_WIRE_DEPTH} levels")
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        raise ValueError("a node is a list that starts with its kind")
    kind, rest = value[0], value[1:]
    match kind:
        case "num":
            (text,), span = _node(kind, rest, 1)
            try:
                return ast.NumberLit(float(_str(text)), span)
            except ValueError:
                raise ValueError(f"not a number: {text!r}") from None
        case "str":
            (text,), span = _node(kind, rest, 1)
            return ast.StringLit(_str(text), span)
        case "bool":
            (flag,), span = _node(kind, rest, 1)
            if not isinstance(flag, bool):
                raise ValueError("a 'bool' node holds true or false")
            return ast.BoolLit(flag, span)
        case "null":
            _, span = _node(kind, rest, 0)
            return ast.NullLit(span)
        case "undef":
            _, span = _node(kind, rest, 0)
            return ast.UndefinedLit(span)
        case "prop":
            (name,), span = _node(kind, rest, 1)
            return ast.Property(_str(name), span)
        case "sys":
            (name, escaped), span = _node(kind, rest, 2)
            if not isinstance(escaped, bool):
                raise ValueError("a 'sys' node's escaped is true or false")
            return ast.SysProperty(_str(name), escaped, span)
        case "call":
            (name, args), span = _node(kind, rest, 2)
            if not isinstance(args, list):
                raise ValueError("a 'call' node's arguments are a list")
            return ast.Call(_str(name), tuple(expr_from_wire(a, depth + 1) for a in args), span)
        case "un":
            (op, operand), span = _node(kind, rest, 2)
            return ast.Unary(_str(op), expr_from_wire(operand, depth + 1), span)
        case "bin":
            (op, left, right), span = _node(kind, rest, 3)
            return ast.Binary(_str(op), expr_from_wire(left, depth + 1), expr_from_wire(right, depth + 1), span)
    raise ValueError(f"unknown node kind {kind!r}")


def route_from_wire(value: Any) -> ast.RouteAst:
    """A route's tree from ``route_to_wire``'s values; ``ValueError`` when it is not one."""
    if not isinstance(value, dict) or set(value) != {"source", "condition", "conditionText", "sink", "span"}:
        raise ValueError("a route is an object of source, condition, conditionText, sink and span")
    cond_text = value["conditionText"]
    if cond_text is not None:
        _str(cond_text)
    condition = expr_from_wire(value["condition"]) if value["condition"] is not None else None
    sink = value["sink"]
    if not isinstance(sink, list) or not sink:
        raise ValueError("a sink is a list that starts with its kind")
    sink_node: ast.SystemSink | ast.FunctionSink
    if sink[0] == "system":
        (name,), span = _node("system", sink[1:], 1)
        sink_node = ast.SystemSink(_str(name), span)
    elif sink[0] == "function":
        (function, argument), span = _node("function", sink[1:], 2)
        sink_node = ast.FunctionSink(_str(function), _str(argument), span)
    else:
        raise ValueError(f"unknown sink kind {sink[0]!r}")
    if not isinstance(value["span"], list):
        raise ValueError("a span is three non-negative integers")
    return ast.RouteAst(_str(value["source"]), condition, cond_text, sink_node, _span_of(value["span"]))
