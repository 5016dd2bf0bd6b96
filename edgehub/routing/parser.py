"""Text to syntax tree: lark (LALR, our tokenizer) and a converter from lark's tree to ``edgehub.routing.ast``.

Syntax errors become ``RouteSyntaxError`` with the position of the offending token; text after a complete
route is an error (Azure IoT Edge silently drops it; here it is reported).

Bounds (a refusal with a position, never a RecursionError or minutes of work): a route or condition has at most
``MAX_TEXT_CHARS`` characters (the tokenizer's positions cost grows with the square of the length), and its
syntax tree at most ``MAX_NESTING`` levels. lark's LALR parser builds the tree without recursion, but the
converter, the compiler and the compiled closures recurse once (the compiler up to three times) per level, so
the tree's depth is checked, without recursion, before any of them sees it. A chain of one operator counts as
deep as it is long (``a OR b OR c`` nests to the left).
"""

from __future__ import annotations

import functools
import math
import re
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from edgehub.routing import ast
from edgehub.routing.errors import Problem, RouteSyntaxError
from edgehub.routing.lexer import RouteLexer, tokenize

__all__ = ["MAX_NESTING", "MAX_TEXT_CHARS", "parse_condition_ast", "parse_route_ast"]

# Twin desired properties are at most 32 KiB in Azure IoT Hub, so no real route is longer.
MAX_TEXT_CHARS = 32_768
# Deep enough for a 100-term OR chain inside a few function calls; shallow enough that three frames per level
# stay far below Python's recursion limit of 1,000 wherever a route is compiled or evaluated.
MAX_NESTING = 200

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
        try:
            return float(int(text[2:], 16))
        except OverflowError:  # beyond the double range (found by fuzzing): infinite, as a decimal literal is
            return math.inf
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


def _check_length(text: str) -> None:
    if len(text) > MAX_TEXT_CHARS:
        line = text.count("\n", 0, MAX_TEXT_CHARS) + 1
        column = MAX_TEXT_CHARS - (text.rfind("\n", 0, MAX_TEXT_CHARS) + 1) + 1
        message = f"text of {len(text)} characters is over the limit of {MAX_TEXT_CHARS}"
        raise RouteSyntaxError(text, [Problem(line, column, message)])


def _check_nesting(text: str, tree: Tree[Token]) -> None:
    """RouteSyntaxError at the first token nested deeper than MAX_NESTING; iterative, so any depth is safe."""
    stack: list[tuple[Tree[Token] | Token, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Token):
            continue
        if depth > MAX_NESTING:
            first: Tree[Token] | Token | None = node
            while isinstance(first, Tree):  # the first token under the node that went too deep
                first = next((c for c in first.children if c is not None), None)
            line = (first.line or 1) if first is not None else 1
            column = (first.column or 1) if first is not None else 1
            message = f"nested deeper than {MAX_NESTING} levels (parentheses, operators and function calls)"
            raise RouteSyntaxError(text, [Problem(line, column, message)])
        stack.extend((child, depth + 1) for child in node.children if child is not None)


def parse_condition_ast(text: str) -> ast.Expr:
    """The tree of a condition, or RouteSyntaxError. An empty or blank condition is ``undefined`` (Azure)."""
    _check_length(text)
    if not tokenize(text):  # every lexical problem at once, before the parser stops at the first
        return ast.UndefinedLit(ast.Span(1, 1, 0))
    try:
        tree = _parser().parse(text, start="condition")
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc, route=False) from None
    _check_nesting(text, tree)
    return _expr(tree)


def parse_route_ast(text: str) -> ast.RouteAst:
    """The tree of a route, or RouteSyntaxError."""
    _check_length(text)
    if not tokenize(text):
        raise RouteSyntaxError(text, [Problem(1, 1, "empty route")])
    try:
        tree = _parser().parse(text, start="route")
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc, route=True) from None
    _check_nesting(text, tree)
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
    if where_tok is not None:
        assert isinstance(where_tok, Token)
        assert isinstance(_into, Token)
        # WHERE with nothing after it: an empty condition, which is undefined (Azure), so the route never matches.
        condition = _expr(cond) if cond is not None else ast.UndefinedLit(_span(where_tok))
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
