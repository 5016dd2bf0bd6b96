"""Hypothesis: the laws of the three-valued logic, and parse → print → parse."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edgehub import Message
from edgehub.routing import Tri, compile_condition
from edgehub.routing.ast import to_text
from edgehub.routing.parser import parse_condition_ast

# Boolean operands with every truth value: true, false, null (false) and undefined.
BOOLS = ["true", "false", "null", "undefined", "(p = 'x')", "(missing = 'x')", "(p = 'y')"]
MSG = Message(body=b"", properties={"p": "x"})
operand = st.sampled_from(BOOLS)


def v(cond: str) -> Tri:
    return compile_condition(cond)(MSG)


@given(operand, operand)
def test_and_and_or_are_commutative(a: str, b: str) -> None:
    assert v(f"{a} AND {b}") is v(f"{b} AND {a}")
    assert v(f"{a} OR {b}") is v(f"{b} OR {a}")


@given(operand, operand, operand)
def test_and_and_or_are_associative(a: str, b: str, c: str) -> None:
    assert v(f"({a} AND {b}) AND {c}") is v(f"{a} AND ({b} AND {c})")
    assert v(f"({a} OR {b}) OR {c}") is v(f"{a} OR ({b} OR {c})")


@given(operand, operand)
def test_de_morgan_holds_in_three_valued_logic(a: str, b: str) -> None:
    assert v(f"NOT ({a} AND {b})") is v(f"(NOT {a}) OR (NOT {b})")
    assert v(f"NOT ({a} OR {b})") is v(f"(NOT {a}) AND (NOT {b})")


@given(operand)
def test_identities_and_double_negation(a: str) -> None:
    base = v(a)
    assert v(f"{a} AND true") is base
    assert v(f"{a} OR false") is base
    assert v(f"{a} AND false") is Tri.FALSE
    assert v(f"{a} OR true") is Tri.TRUE
    assert v(f"NOT NOT {a}") is base


@given(operand, operand)
def test_false_wins_and_true_wins(a: str, b: str) -> None:
    va, vb = v(a), v(b)
    conj = v(f"{a} AND {b}")
    if Tri.FALSE in (va, vb):
        assert conj is Tri.FALSE
    elif Tri.UNDEFINED in (va, vb):
        assert conj is Tri.UNDEFINED
    else:
        assert conj is Tri.TRUE


# A generator of well-formed, well-typed conditions for the round trip.
names = st.sampled_from(["a", "temp-1", "B", "$messageId", "{$to}", "$body.x.y", "$body.arr[2]"])
strings = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=8).map(
    lambda s: "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"
)
numbers = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str),
    st.floats(min_value=0, max_value=1e6, allow_nan=False).map(repr),
    st.sampled_from(["0x1F", ".5", "1.5e3", "-3"]),
)
num_expr = st.recursive(
    st.one_of(numbers, names.map(lambda n: f"as_number({n})")),
    lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"
    ),
    max_leaves=4,
)
str_expr = st.one_of(strings, names, st.tuples(names, strings).map(lambda t: f"concat({t[0]}, {t[1]})"))
comparison = st.one_of(
    st.tuples(num_expr, st.sampled_from(["<", "<=", ">", ">=", "=", "<>", "!="]), num_expr).map(" ".join),
    st.tuples(str_expr, st.sampled_from(["=", "<>", "<"]), str_expr).map(" ".join),
    names.map(lambda n: f"is_defined({n})"),
)
condition = st.recursive(
    comparison,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR", "and", "Or"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda c: f"NOT ({c})"),
    ),
    max_leaves=5,
)


@settings(max_examples=200)
@given(condition)
def test_parse_print_parse_gives_the_same_tree(text: str) -> None:
    tree = parse_condition_ast(text)
    printed = to_text(tree)
    assert parse_condition_ast(printed) == tree
    compile_condition(printed)  # and the printed text still type-checks


@settings(max_examples=100)
@given(condition)
def test_printed_condition_gives_the_same_verdict(text: str) -> None:
    m = Message(
        body=b'{"x": {"y": "1"}, "arr": [1, 2, 3]}',
        properties={"a": "4", "temp-1": "x", "b": "2.5"},
        system_properties={"messageId": "7", "contentType": "application/json", "contentEncoding": "utf-8"},
    )
    assert compile_condition(text)(m) is compile_condition(to_text(parse_condition_ast(text)))(m)
