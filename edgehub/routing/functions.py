"""The route language's built-in functions: their static signatures and their implementations.

Each implementation takes runtime values (see ``edgehub.routing.values``) whose static types were checked at
compile time, but a body value may still be of any JSON type at run time.

Invariants: no implementation raises on any argument; a wrong runtime type, a NaN or a domain error gives
``UNDEF``, and an overflow gives an infinity.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgehub.routing.values import ANY, BOOL, NULL, NUMBER, STRING, UNDEF, UNDEFINED

__all__ = ["BUILTINS", "Builtin", "concat"]

_AS_NUMBER = re.compile(r"^\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$")


def _num(value: float) -> Any:
    return UNDEF if value != value else value


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


def concat(*args: Any) -> Any:
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
    if i < 0 or i >= len(s):  # a start at or past the end is undefined (Azure), even with length 0
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
class Builtin:
    params: tuple[tuple[str, ...], ...]  # allowed static types per parameter
    result: str
    impl: Callable[..., Any]
    min_args: int
    max_args: int | None  # None: varargs of the last parameter's types
    sees_undefined: bool = False  # is_* functions see UNDEF instead of propagating it


_N, _S, _ALL = (NUMBER,), (STRING,), (NUMBER, STRING, BOOL, NULL, UNDEFINED, ANY)
BUILTINS: dict[str, Builtin] = {
    "abs": Builtin((_N,), NUMBER, _math1(abs), 1, 1),
    "exp": Builtin((_N,), NUMBER, _math1(math.exp), 1, 1),
    "power": Builtin((_N, _N), NUMBER, _power, 2, 2),
    "square": Builtin((_N,), NUMBER, _math1(lambda x: x * x), 1, 1),
    "ceiling": Builtin((_N,), NUMBER, _math1(_ceil_floor(math.ceil)), 1, 1),
    "floor": Builtin((_N,), NUMBER, _math1(_ceil_floor(math.floor)), 1, 1),
    "sign": Builtin((_N,), NUMBER, _math1(_sign), 1, 1),
    "sqrt": Builtin((_N,), NUMBER, _math1(_sqrt), 1, 1),
    "as_number": Builtin(((NUMBER, STRING),), NUMBER, _as_number, 1, 1),
    "is_bool": Builtin((_ALL,), BOOL, lambda x: type(x) is bool, 1, 1, True),
    "is_defined": Builtin((_ALL,), BOOL, lambda x: x is not UNDEF, 1, 1, True),
    "is_null": Builtin((_ALL,), BOOL, lambda x: x is None, 1, 1, True),
    "is_number": Builtin((_ALL,), BOOL, lambda x: type(x) is float and math.isfinite(x), 1, 1, True),
    "is_string": Builtin((_ALL,), BOOL, lambda x: type(x) is str, 1, 1, True),
    "concat": Builtin((_S, _S), STRING, concat, 2, None),
    "length": Builtin((_S,), NUMBER, _str1(lambda s: float(len(s))), 1, 1),
    "lower": Builtin((_S,), STRING, _str1(str.lower), 1, 1),
    "upper": Builtin((_S,), STRING, _str1(str.upper), 1, 1),
    "substring": Builtin((_S, _N, _N), STRING, _substring, 2, 3),
    "index_of": Builtin((_S, _S), NUMBER, _str2(lambda s, f: float(s.find(f))), 2, 2),
    "starts_with": Builtin((_S, _S), BOOL, _str2(str.startswith), 2, 2),
    "ends_with": Builtin((_S, _S), BOOL, _str2(str.endswith), 2, 2),
    "contains": Builtin((_S, _S), BOOL, _str2(lambda s, f: f in s), 2, 2),
}
