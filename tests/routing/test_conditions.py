"""Every rule of docs/routes.md's "Conditions", table-driven."""

from __future__ import annotations

import json

import pytest

from edgehub import Message
from edgehub.routing import RouteCompileError, RouteError, RouteSyntaxError, Tri, compile_condition

T, F, U = Tri.TRUE, Tri.FALSE, Tri.UNDEFINED

JSON_SYS = {"contentType": "application/json", "contentEncoding": "utf-8"}


def msg(
    props: dict[str, str | None] | None = None,
    sys: dict[str, str] | None = None,
    body: object = None,
    raw_body: bytes | None = None,
) -> Message:
    if raw_body is None:
        raw_body = b"" if body is None else json.dumps(body).encode()
    system = dict(JSON_SYS if body is not None else {})
    system.update(sys or {})
    return Message(body=raw_body, properties=props or {}, system_properties=system)


def verdict(cond: str, m: Message | None = None) -> Tri:
    return compile_condition(cond)(m or msg())


PROPS = {"a": "x", "b": "y", "n": "5", "nothing": None, "Mixed": "M", "temp-1": "t1", "TRUE": "yes"}


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        # literals
        ("true", T),
        ("false", F),
        ("null", F),
        ("NOT null", T),
        ("undefined", U),
        ("NOT undefined", U),
        ("5", U),
        ("'s'", U),
        # numbers: all doubles, hex, exponent, leading zeros, .5
        ("100 = 100.0", T),
        ("0x1F = 31", T),
        ("0X1f = 31", T),
        ("1.5e3 = 1500", T),
        (".5 = 0.5", T),
        ("007 = 7", T),
        ("-3 < 0", T),
        ("- 3 = -3", T),
        ("1e999 > 1e308", T),
        # IEEE edge cases
        ("3 / 0 > 1e308", T),
        ("-3 / 0 < 0", T),
        ("is_defined(3 / 0)", T),
        ("0 / 0 = 0 / 0", U),
        ("is_defined(0 / 0)", F),
        ("3 % 0 = 0", U),
        ("is_defined(3 % 0)", F),
        ("-7 % 3 = -1", T),
        ("7 % -3 = 1", T),
        ("5.5 % 2 = 1.5", T),
        ("1e308 * 10 > 1e308", T),
        ("is_number(1e308 * 10)", F),
        ("is_number(1.5)", T),
        # precedence: * over +, + over <, < over =, = over AND, AND over OR, OR over ??
        ("2 + 3 * 4 = 14", T),
        ("(2 + 3) * 4 = 20", T),
        ("10 - 4 - 3 = 3", T),
        ("2 * 3 % 4 = 2", T),
        ("1 < 2 = true", T),
        ("true OR false AND false", T),
        ("(true OR false) AND false", F),
        ("NOT true = false", T),
        ("NOT false AND false", F),
        ("undefined ?? true", T),
        ("false ?? true", F),
        ("null ?? true", F),
        ("'a' || 'b' = 'ab'", T),
        ("'a' || 'b' || 'c' = 'abc'", T),
        # case-insensitive keywords
        ("true and TRUE = TRUE", U),
        ("true AnD true", T),
        ("false oR true", T),
        ("nOt false", T),
        # three-valued logic
        ("undefined AND false", F),
        ("false AND undefined", F),
        ("undefined AND true", U),
        ("undefined OR true", T),
        ("true OR undefined", T),
        ("undefined OR false", U),
        ("null AND true", F),
        ("null OR true", T),
        ("null OR false", F),
        # comparisons with undefined and null
        ("undefined = undefined", U),
        ("undefined <> 1", U),
        ("null = null", T),
        ("null <> null", F),
        ("null = 1", U),
        ("null = 'a'", U),
        ("null = true", U),
        ("null < 1", U),
        # strings: ordinal, case-sensitive
        ("'a' < 'b'", T),
        ("'B' < 'a'", T),
        ("'a' = 'A'", F),
        ("'abc' >= 'abc'", T),
        ("'a' != 'b'", T),
        ("'a' <> 'a'", F),
        # escapes
        ("'it\\'s' = \"it's\"", T),
        ("'\\u0041' = 'A'", T),
        ("'back\\\\slash' = concat('back', '\\\\', 'slash')", T),
        # comments
        ("/* a comment */ true", T),
        ("true /* and */ AND /* more */ true", T),
    ],
)
def test_literals_operators_and_logic(cond: str, expected: Tri) -> None:
    assert verdict(cond) is expected


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        ("a = 'x'", T),
        ("A = 'x'", T),
        ("mixed = 'M'", T),
        ("MIXED = 'm'", F),
        ("missing = 'x'", U),
        ("missing <> 'x'", U),
        ("NOT (missing = 'x')", U),
        ("is_defined(missing)", F),
        ("temp-1 = 't1'", T),
        ("TRUE = 'yes'", T),
        ("a = 'x' AND b = 'y'", T),
        ("a = 'x' AND missing = 'y'", U),
        ("a = 'nope' AND missing = 'y'", F),
        ("a = 'x' OR missing = 'y'", T),
        ("(missing ?? 'd') = 'd'", T),
        ("(a ?? 'd') = 'x'", T),
        ("as_number(n) > 4", T),
        ("as_number(n) + 1 = 6", T),
        ("as_number(a) > 4", U),
        # a property present with a null value is a null string
        ("is_null(nothing)", T),
        ("is_defined(nothing)", T),
        ("is_string(nothing)", F),
        ("is_defined(length(nothing))", F),
        ("is_defined(lower(nothing))", F),
        ("is_defined(upper(nothing))", F),
        ("is_defined(substring(nothing, 0))", F),
        ("concat(nothing, 'a') = 'a'", T),
        ("nothing || 'a' = 'a'", T),
        ("nothing = null", T),
        ("nothing = 'x'", U),
        ("(nothing ?? 'd') = 'd'", U),
        # a string property as a whole condition is not a bool
        ("a", U),
    ],
)
def test_application_properties(cond: str, expected: Tri) -> None:
    assert verdict(cond, msg(props=PROPS)) is expected


SYS = {
    "messageId": "m-1",
    "connectionDeviceId": "dev1",
    "connectionModuleId": "mod1",
    "outputName": "out",
    "cid": "c-9",
    "contentType": "text/plain",
    "edgeMessageId": "e-1",
}


@pytest.mark.parametrize(
    ("props", "cond", "expected"),
    [
        ({}, "$connectionDeviceId = 'dev1'", T),
        ({}, "$connectiondeviceid = 'dev1'", T),
        ({}, "$messageId = 'm-1'", T),
        ({}, "$cid = 'c-9'", T),
        ({}, "$outputName = 'out'", T),
        ({}, "$edgeMessageId = 'e-1'", T),
        ({}, "$to = 'x'", U),
        ({}, "is_defined($unknownName)", F),
        # an application property literally named $name wins over the system property
        ({"$messageId": "app"}, "$messageId = 'app'", T),
        ({"$messageId": "app"}, "{$messageId} = 'm-1'", T),
        ({}, "{$messageId} = 'm-1'", T),
    ],
)
def test_system_properties_and_escapes(props: dict[str, str | None], cond: str, expected: Tri) -> None:
    assert verdict(cond, msg(props=props, sys=SYS)) is expected


BODY = {"t": 21, "s": "hot", "b": True, "n": None, "o": {"x": {"y": 7}}, "arr": [1, {"c": "deep"}, 3], "f": 1.5}


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        ("$body.t = 21", T),
        ("$body.t > 20", T),
        ("$body.t + 1 = 22", T),
        ("$body.f * 2 = 3", T),
        ("$body.s = 'hot'", T),
        ("$body.s > 'a'", T),
        ("$body.b", T),
        ("NOT $body.b", F),
        ("$body.b AND true", T),
        ("$body.o.x.y = 7", T),
        ("$body.arr[0] = 1", T),
        ("$body.arr[1].c = 'deep'", T),
        ("$body.arr[9] = null", T),
        ("$body.missing = null", T),
        ("$body.missing.deeper = null", T),
        ("is_null($body.n)", T),
        ("$body.n = null", T),
        # objects and arrays are undefined
        ("is_defined($body.o)", F),
        ("is_defined($body.arr)", F),
        # different JSON types compare unequal, never fail
        ("$body.t = 'hot'", F),
        ("$body.t <> 'hot'", T),
        ("$body.s = 21", F),
        ("$body.b = 1", F),
        ("$body.t < 'a'", U),
        # arithmetic on a non-number body value is undefined
        ("$body.s + 1 = 2", U),
        ("- $body.s = 1", U),
        ("$body.t = $body.t", T),
        # body values fit any static type
        ("lower($body.s) = 'hot'", T),
        ("length($body.t) = 2", U),
        ("{$body.t} = 21", T),
        ("$BODY.t = 21", T),
    ],
)
def test_body_queries(cond: str, expected: Tri) -> None:
    assert verdict(cond, msg(body=BODY)) is expected


@pytest.mark.parametrize(
    ("sys", "raw", "expected"),
    [
        ({"contentType": "application/json", "contentEncoding": "utf-8"}, b'{"t": 21}', T),
        ({"contentType": "Application/JSON", "contentEncoding": "UTF-8"}, b'{"t": 21}', T),
        ({"contentType": "application/json", "contentEncoding": "utf-16"}, '{"t": 21}'.encode("utf-16"), T),
        ({"contentType": "application/json", "contentEncoding": "utf-32"}, '{"t": 21}'.encode("utf-32"), T),
        ({"contentType": "application/json"}, b'{"t": 21}', U),
        ({"contentType": "text/plain", "contentEncoding": "utf-8"}, b'{"t": 21}', U),
        ({"contentEncoding": "utf-8"}, b'{"t": 21}', U),
        ({"contentType": "application/json", "contentEncoding": "latin-1"}, b'{"t": 21}', U),
        ({"contentType": "application/json", "contentEncoding": "utf-8"}, b'{"t": 21', U),
        ({"contentType": "application/json", "contentEncoding": "utf-8"}, b"\xff\xfe", U),
    ],
)
def test_body_queries_need_json_content_type_and_utf_encoding(sys: dict[str, str], raw: bytes, expected: Tri) -> None:
    m = Message(body=raw, system_properties=sys)
    assert compile_condition("$body.t = 21")(m) is expected


def test_a_body_integer_beyond_the_double_range_is_infinite_not_an_error() -> None:
    m = msg(body={"big": 10**400, "neg": -(10**400)})
    assert compile_condition("$body.big > 1e308")(m) is T
    assert compile_condition("$body.neg < -1e308")(m) is T
    assert compile_condition("is_number($body.big)")(m) is F


def test_an_application_property_named_like_a_body_query_wins() -> None:
    m = msg(props={"$body.t": "app"}, body={"t": 21})
    assert compile_condition("$body.t = 'app'")(m) is T
    assert compile_condition("{$body.t} = 21")(m) is T


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        ("abs(-2) = 2", T),
        ("exp(0) = 1", T),
        ("exp(1000) > 1e308", T),
        ("power(2, 10) = 1024", T),
        ("power(0, -1) > 1e308", T),
        ("is_defined(power(-8, 0.5))", F),
        ("square(3) = 9", T),
        ("ceiling(1.2) = 2", T),
        ("ceiling(-1.2) = -1", T),
        ("floor(1.8) = 1", T),
        ("floor(-1.2) = -2", T),
        ("sign(-5) = -1", T),
        ("sign(0) = 0", T),
        ("sign(3) = 1", T),
        ("sqrt(16) = 4", T),
        ("is_defined(sqrt(-1))", F),
        ("as_number('12.5') = 12.5", T),
        ("as_number(' 7 ') = 7", T),
        ("as_number('-1e3') = -1000", T),
        ("as_number(4) = 4", T),
        ("is_defined(as_number('abc'))", F),
        ("is_defined(as_number(''))", F),
        ("is_bool(true)", T),
        ("is_bool('true')", F),
        ("is_defined(undefined)", F),
        ("is_defined(null)", T),
        ("is_null(null)", T),
        ("is_null(undefined)", F),
        ("is_number(1)", T),
        ("is_number('1')", F),
        ("is_number(1 / 0)", F),
        ("is_string('s')", T),
        ("is_string(1)", F),
        ("concat('a', 'b') = 'ab'", T),
        ("concat('a', 'b', 'c', 'd') = 'abcd'", T),
        ("length('abc') = 3", T),
        ("length('') = 0", T),
        ("lower('AbC') = 'abc'", T),
        ("upper('AbC') = 'ABC'", T),
        ("substring('hello', 1) = 'ello'", T),
        ("substring('hello', 1, 3) = 'ell'", T),
        ("is_defined(substring('hello', 5))", F),
        ("substring('hello', 4) = 'o'", T),
        ("is_defined(substring('hello', 6))", F),
        ("is_defined(substring('hello', -1))", F),
        ("is_defined(substring('hello', 2, 4))", F),
        ("index_of('hello', 'l') = 2", T),
        ("index_of('hello', 'z') = -1", T),
        ("starts_with('hello', 'he')", T),
        ("starts_with('hello', 'He')", F),
        ("ends_with('hello', 'lo')", T),
        ("contains('hello', 'ell')", T),
        ("contains('hello', 'ELL')", F),
        ("ABS(-1) = 1", T),
        ("Lower('A') = 'a'", T),
    ],
)
def test_built_in_functions(cond: str, expected: Tri) -> None:
    assert verdict(cond) is expected


@pytest.mark.parametrize(
    ("cond", "fragment", "column"),
    [
        ("temp > 50", "operator '>' needs operands of one type, not string and number", 6),
        ("a = 1", "not string and number", 3),
        ("1 + 'a' = 2", "operator '+' needs numbers", 3),
        ("'a' || 1 = 'a'", "operator '||' needs strings", 5),
        ("NOT 1", "operator NOT needs a bool, not number", 1),
        ("- 'a' = 1", "operator '-' needs a number, not string", 1),
        ("1 AND true", "operator AND needs bools", 3),
        ("true OR 'x'", "operator OR needs bools", 6),
        ("1 ?? 'a' = 'a'", "operator '??' needs operands of one type", 3),
        ("missing ?? 'd' = 'd'", "operator '??' needs operands of one type, not string and bool", 9),
        ("nosuch(1)", "unknown function 'nosuch'", 1),
        ("abs(1, 2) = 1", "function abs takes 1 arguments, not 2", 1),
        ("concat('a') = 'a'", "function concat takes 2 or more arguments, not 1", 1),
        ("substring('a') = 'a'", "function substring takes 2 to 3 arguments", 1),
        ("abs('a') = 1", "argument 1 of abs must be number, not string", 5),
        ("lower(1) = 'a'", "argument 1 of lower must be string, not number", 7),
        ("as_number(true) = 1", "argument 1 of as_number must be number or string, not bool", 11),
        ("$body.a[] = 1", "unsupported body query", 1),
        ("$body.a[*] = 1", "unsupported body query", 1),
        ("$body.a['b'] = 1", "unsupported body query", 1),
        ("twin_change_includes('properties.reported.a')", "only allowed in routes FROM /twinChangeNotifications", 1),
    ],
)
def test_compile_errors_name_the_problem_and_its_position(cond: str, fragment: str, column: int) -> None:
    with pytest.raises(RouteCompileError) as info:
        compile_condition(cond)
    assert fragment in str(info.value)
    assert (info.value.line, info.value.column) == (1, column)


@pytest.mark.parametrize(
    ("cond", "fragment", "line", "column"),
    [
        ("a = 'x", "unterminated string", 1, 5),
        ('a = "x', "unterminated string", 1, 5),
        ("a @ 'x'", "unknown symbol '@'", 1, 3),
        ("a = 'x' AND\n  b ; 'y'", "unknown symbol ';'", 2, 5),
        ("a = ", "unexpected end of condition", 1, 5),
        ("(a = 'x'", "unexpected end of condition: expected ')'", 1, 9),
        ("a = 'x')", "unexpected text ')' after the end of the condition", 1, 8),
        ("a == 'x'", "unexpected '='", 1, 4),
        ("$body.a[1:2] = 1", "unknown symbol ':'", 1, 10),
    ],
)
def test_syntax_errors_name_the_problem_and_its_position(cond: str, fragment: str, line: int, column: int) -> None:
    with pytest.raises(RouteSyntaxError) as info:
        compile_condition(cond)
    assert fragment in str(info.value)
    assert (info.value.line, info.value.column) == (line, column)


def test_every_problem_is_reported_with_a_caret_under_it() -> None:
    with pytest.raises(RouteError) as info:
        compile_condition("a > 1 AND nosuch(2) AND\n    b = 3")
    err = info.value
    assert [(p.line, p.column) for p in err.problems] == [(1, 3), (1, 11), (2, 7)]
    text = str(err)
    assert "line 1, column 11: unknown function 'nosuch'\n    a > 1 AND nosuch(2) AND\n              ^^^^^^" in text
    assert "line 2, column 7" in text
    assert "\n          ^" in text


def test_every_lexical_problem_is_reported() -> None:
    with pytest.raises(RouteSyntaxError) as info:
        compile_condition("a @ b ; c")
    assert [p.column for p in info.value.problems] == [3, 7]
