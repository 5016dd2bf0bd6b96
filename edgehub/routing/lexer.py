"""The route language's tokenizer, matching Azure IoT Edge's ANTLR lexer rule for rule.

At each position the longest match wins, and on a tie the rule listed first wins (ANTLR's rule). That is what
makes ``temp-1`` one identifier, ``-3`` a number, ``NOT`` a keyword but ``nothing`` a name, and ``TRUE`` a
property name (the literals are lower-case only). One deliberate difference: a number needs a digit before an
exponent (Azure lexes ``e5`` as a number; here it is a property name).

``tokenize`` returns every token, or raises ``RouteSyntaxError`` listing every unknown symbol and unterminated
string in the text. A ``/*`` with no ``*/`` after it is not a comment (as in ANTLR): ``FROM /*`` is a path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from lark import Token
from lark.lexer import Lexer

from edgehub.routing.errors import Problem, RouteSyntaxError

__all__ = ["RouteLexer", "tokenize"]

_RULES: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in [
        ("SELECT", r"(?i:select)"),
        ("FROM", r"(?i:from)"),
        ("WHERE", r"(?i:where)"),
        ("INTO", r"(?i:into)"),
        ("STRING", r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\''),
        ("UNTERMINATED_STRING", r'"(?:\\.|[^"\\])*|\'(?:\\.|[^\'\\])*'),
        ("INTEGER", r"-?[0-9]+"),
        ("HEX", r"0[xX][0-9a-fA-F]+"),
        ("REAL", r"-?[0-9]*\.[0-9]+(?:[eE][+-]?[0-9]+)?|-?[0-9]+[eE][+-]?[0-9]+"),
        ("TRUE", r"true"),
        ("FALSE", r"false"),
        ("NULL", r"null"),
        ("UNDEFINED", r"undefined"),
        ("LPAR", r"\("),
        ("RPAR", r"\)"),
        ("COMMA", r","),
        ("PLUS", r"\+"),
        ("MINUS", r"-"),
        ("STAR", r"\*"),
        ("SLASH", r"/"),
        ("PERCENT", r"%"),
        ("AND", r"(?i:and)"),
        ("OR", r"(?i:or)"),
        ("NOT", r"(?i:not)"),
        ("EQ", r"="),
        ("NE", r"!=|<>"),
        ("LE", r"<="),
        ("GE", r">="),
        ("GT", r">"),
        ("LT", r"<"),
        ("CONCAT", r"\|\|"),
        ("COALESCE", r"\?\?"),
        ("LBRACE", r"\{"),
        ("RBRACE", r"\}"),
        ("SYS_PROP", r"\$[^()<>@,;:\\\"/?={}\s]+"),
        ("ID", r"[^()<>@,;:\\\"/\[\]?={}\s]+"),
    ]
]
_WS = re.compile(r"\s+")
_NUMBER_TYPES = {"INTEGER": "NUMBER", "HEX": "NUMBER", "REAL": "NUMBER"}


def _position(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return line, column


def _make_token(kind: str, text: str, start: int, end: int) -> Token:
    line, column = _position(text, start)
    end_line, end_column = _position(text, end)
    return Token(
        kind,
        text[start:end],
        start_pos=start,
        line=line,
        column=column,
        end_line=end_line,
        end_column=end_column,
        end_pos=end,
    )


def tokenize(text: str) -> list[Token]:
    """All tokens of ``text`` (numbers as NUMBER), or RouteSyntaxError with every lexical problem."""
    tokens: list[Token] = []
    problems: list[Problem] = []
    pos, n = 0, len(text)
    while pos < n:
        ws = _WS.match(text, pos)
        if ws:
            pos = ws.end()
            continue
        if text.startswith("/*", pos):
            # As in ANTLR, a comment needs its "*/"; without one, "/*" is two tokens (routes say FROM /*).
            close = text.find("*/", pos + 2)
            if close >= 0:
                pos = close + 2
                continue
        best_kind, best_end = "", pos
        for kind, rx in _RULES:
            m = rx.match(text, pos)
            if m and m.end() > best_end:
                best_kind, best_end = kind, m.end()
        if not best_kind:
            line, column = _position(text, pos)
            problems.append(Problem(line, column, f"unknown symbol {text[pos]!r}"))
            pos += 1
            continue
        if best_kind == "UNTERMINATED_STRING":
            line, column = _position(text, pos)
            problems.append(Problem(line, column, "unterminated string", best_end - pos))
            pos = best_end
            continue
        tokens.append(_make_token(_NUMBER_TYPES.get(best_kind, best_kind), text, pos, best_end))
        pos = best_end
    if problems:
        raise RouteSyntaxError(text, problems)
    return tokens


class RouteLexer(Lexer):
    """lark's hook for our tokenizer (the ``__future_interface__ = 0`` form: ``lex(text)``)."""

    __future_interface__ = 0

    def __init__(self, lexer_conf: Any) -> None:
        pass

    def lex(self, data: str) -> Iterator[Token]:  # type: ignore[override]
        yield from tokenize(data)
