"""Text to syntax tree: lark (LALR, our tokenizer) and a converter from lark's tree to ``edgehub.routing.ast``.

Syntax errors become ``RouteSyntaxError`` with the position of the offending token; text after a complete
route is an error (Azure IoT Edge silently drops it; here it is reported).
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from edgehub.routing import ast
from edgehub.routing.errors import Problem, RouteSyntaxError
from edgehub.routing.lexer import RouteLexer, tokenize

__all__ = ["parse_condition_ast", "parse_route_ast"]

_READABLE = {
    "SELECT": "SELECT",
    "FROM": "FROM",
    "WHERE": "WHERE",
    "INTO": "INTO",
    "STRING": "a string",
    "NUMBER": "a number",
    "ID": "a name",
    "SYS_PROP": "a $name",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "SLASH": "'/'",
    "STAR": "'*'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "$END": "the end",
}


@functools.cache
def _parser() -> Lark:
    grammar = resources.files("edgehub.routing").joinpath("route.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", lexer=RouteLexer, start=["route", "condition"], maybe_placeholders=True)


def _span(tok: Token) -> ast.Span:
    return ast.Span(tok.line or 1, tok.column or 1, max(1, len(tok.value)))


def _unescape(body: str) -> str:
    body = re.sub(r"\\[Uu]([0-9A-Fa-f]{4})", lambda m: chr(int(m.group(1), 16)), body)
    return re.sub(r"\\([\"'\\])", lambda m: m.group(1), body)


def _number(text: str) -> float:
    if text[:2] in ("0x", "0X"):
        return float(int(text[2:], 16))
    return float(text)  # float() gives inf on overflow, as .NET's double.Parse does


def _expr(node: Tree[Token] | Token) -> ast.Expr:
    if isinstance(node, Token):
        raise TypeError(f"unexpected token {node!r}")
    kids = node.children
    match node.data:
        case "number":
            tok = kids[0]
            assert isinstance(tok, Token)
            return ast.NumberLit(_number(tok.value), _span(tok))
        case "string":
            tok = kids[0]
            assert isinstance(tok, Token)
            return ast.StringLit(_unescape(tok.value[1:-1]), _span(tok))
        case "true" | "false":
            tok = kids[0]
            assert isinstance(tok, Token)
            return ast.BoolLit(node.data == "true", _span(tok))
        case "null":
            tok = kids[0]
            assert isinstance(tok, Token)
            return ast.NullLit(_span(tok))
        case "undefined":
            tok = kids[0]
            assert isinstance(tok, Token)
            return ast.UndefinedLit(_span(tok))
        case "property":
            tok = kids[0]
            assert isinstance(tok, Token)
            return ast.Property(tok.value, _span(tok))
        case "sys_property":
            tok = kids[0]
            assert isinstance(tok, Token)
            return ast.SysProperty(tok.value, False, _span(tok))
        case "escaped_sys_property":
            tok = kids[1]
            assert isinstance(tok, Token)
            return ast.SysProperty(tok.value, True, _span(tok))
        case "call":
            name, args = kids[0], kids[2]
            assert isinstance(name, Token)
            arg_nodes = () if args is None else tuple(_expr(a) for a in args.children[::2])  # type: ignore[union-attr]
            return ast.Call(name.value, arg_nodes, _span(name))
        case "unary":
            op, operand = kids
            assert isinstance(op, Token)
            return ast.Unary("NOT" if op.type == "NOT" else "-", _expr(operand), _span(op))
        case "binary":
            left, op, right = kids
            assert isinstance(op, Token)
            op_text = op.value.upper() if op.type in ("AND", "OR") else op.value
            return ast.Binary(op_text, _expr(left), _expr(right), _span(op))
        case "condition":
            return _expr(kids[0])
        case "atom":  # ( expr )
            return _expr(kids[1])
    raise TypeError(f"unexpected tree {node.data!r}")


def _syntax_error(text: str, exc: UnexpectedInput, *, route: bool) -> RouteSyntaxError:
    if (isinstance(exc, UnexpectedToken) and exc.token.type == "$END") or isinstance(exc, UnexpectedEOF):
        expected = sorted(_READABLE.get(e, e) for e in getattr(exc, "expected", ()) if e != "$END")
        line = text.count("\n") + 1
        column = len(text) - (text.rfind("\n") + 1) + 1
        what = "route" if route else "condition"
        message = f"unexpected end of {what}" + (f": expected {', '.join(expected)}" if expected else "")
        return RouteSyntaxError(text, [Problem(line, column, message)])
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        expected_set = set(exc.expected)
        if expected_set == {"$END"}:
            what = "route" if route else "condition"
            message = f"unexpected text {tok.value!r} after the end of the {what}"
        else:
            expected = sorted(_READABLE.get(e, e.lower()) for e in expected_set)
            message = f"unexpected {tok.value!r}: expected {', '.join(expected)}"
        return RouteSyntaxError(text, [Problem(tok.line or 1, tok.column or 1, message, max(1, len(tok.value)))])
    if isinstance(exc, UnexpectedCharacters):
        return RouteSyntaxError(text, [Problem(exc.line, exc.column, "unknown symbol")])
    return RouteSyntaxError(text, [Problem(1, 1, str(exc))])


def parse_condition_ast(text: str) -> ast.Expr:
    """The tree of a condition, or RouteSyntaxError."""
    if not tokenize(text):  # every lexical problem at once, before the parser stops at the first
        raise RouteSyntaxError(text, [Problem(1, 1, "empty condition")])
    try:
        tree = _parser().parse(text, start="condition")
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc, route=False) from None
    return _expr(tree)


def parse_route_ast(text: str) -> ast.RouteAst:
    """The tree of a route, or RouteSyntaxError."""
    if not tokenize(text):
        raise RouteSyntaxError(text, [Problem(1, 1, "empty route")])
    try:
        tree = _parser().parse(text, start="route")
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc, route=True) from None
    kids = tree.children
    # route: [SELECT STAR] FROM path [WHERE expr] INTO sink  (placeholders keep positions fixed)
    _select, _star, from_tok, path, where_tok, cond, _into, sink = kids
    assert isinstance(path, Tree)
    assert isinstance(sink, Tree)
    assert isinstance(from_tok, Token)
    source = "".join(
        tok.value
        for child in path.children
        for tok in ([child] if isinstance(child, Token) else child.children)
        if isinstance(tok, Token)
    )
    condition = None
    condition_text = None
    if cond is not None:
        assert isinstance(where_tok, Token)
        assert isinstance(_into, Token)
        condition = _expr(cond)
        condition_text = text[where_tok.end_pos : _into.start_pos].strip()
    if sink.data == "system_sink":
        tok = sink.children[0]
        assert isinstance(tok, Token)
        sink_node: ast.SystemSink | ast.FunctionSink = ast.SystemSink(tok.value, _span(tok))
    else:
        fn, _lp, arg, _rp = sink.children
        assert isinstance(fn, Token)
        assert isinstance(arg, Token)
        sink_node = ast.FunctionSink(fn.value, _unescape(arg.value[1:-1]), _span(fn))
    return ast.RouteAst(source, condition, condition_text, sink_node, _span(from_tok))
