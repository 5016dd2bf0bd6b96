"""Route trees across a process boundary (``edgehub.routing.wire``): a tree sent as JSON values and compiled in
another process routes every message as the text does, a malformed one is a ValueError (never a RecursionError),
and a process that compiles routes from trees never loads lark."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgehub import Message
from edgehub.routing import Router
from edgehub.routing.parser import MAX_NESTING, parse_route_ast
from edgehub.routing.wire import route_from_wire, route_to_wire

pytestmark = pytest.mark.timeout(60)

ROUTES = {
    "hot": "FROM /messages/* WHERE as_number(temperature) > 30.5 AND $connectionDeviceId = 'dev1' INTO $upstream",
    "text": "FROM /messages/modules/f/outputs/* WHERE NOT (is_defined(x)) OR {$contentType} <> 'a\\'b' INTO $upstream",
    "inf": "FROM /messages/* WHERE -(as_number(x)) < 1e999 AND lower(concat(p, 'Q')) = 'vq' INTO $upstream",
    "lone": "FROM /messages/* WHERE p = '\\uD800' OR p = null OR q = undefined OR is_bool(b) = true INTO $upstream",
    "body": 'FROM /messages/* WHERE $body.x.Temperature >= 21 INTO BrokeredEndpoint("/modules/m/inputs/in1")',
    "all": "FROM /* INTO $upstream",
    "empty": "FROM /messages/* WHERE INTO $upstream",
}
MESSAGES = [
    Message(b"{}", properties={"temperature": "31", "p": "v"}, system_properties={"connectionDeviceId": "dev1"}),
    Message(b"{}", properties={"x": "1", "p": "\ud800"}),
    Message(
        json.dumps({"x": {"Temperature": 21.5}}).encode(),
        properties={"b": "true"},
        system_properties={"contentType": "application/json", "contentEncoding": "utf-8"},
    ),
]


def over_the_wire(text: str) -> object:
    return json.loads(json.dumps(route_to_wire(parse_route_ast(text))))


def test_a_tree_sent_as_json_values_comes_back_equal_and_routes_as_its_text() -> None:
    trees = {name: route_from_wire(over_the_wire(text)) for name, text in ROUTES.items()}
    for name, text in ROUTES.items():
        assert trees[name] == parse_route_ast(text)
    by_text, by_tree = Router(ROUTES), Router(ROUTES, trees=trees)
    assert [r.route for r in by_tree.routes] == [r.route for r in by_text.routes]
    for message in MESSAGES:
        assert by_tree.route(message) == by_text.route(message)


@pytest.mark.parametrize(
    "value",
    [
        None,
        {"source": "/"},
        {**over_the_wire(ROUTES["hot"]), "sink": ["queue", "x", 1, 1, 1]},  # type: ignore[dict-item]
        {**over_the_wire(ROUTES["hot"]), "condition": ["bin", "AND", ["num", "x", 1, 1, 1]]},  # type: ignore[dict-item]
        {**over_the_wire(ROUTES["hot"]), "condition": ["num", "not a number", 1, 1, 1]},  # type: ignore[dict-item]
        {**over_the_wire(ROUTES["hot"]), "condition": ["bool", 1, 1, 1, 1]},  # type: ignore[dict-item]
        {**over_the_wire(ROUTES["hot"]), "span": [1, -1, 1]},  # type: ignore[dict-item]
    ],
)
def test_a_malformed_tree_is_a_value_error(value: object) -> None:
    with pytest.raises(ValueError):
        route_from_wire(value)


def test_a_tree_deeper_than_the_parser_allows_is_a_value_error_not_a_recursion_error() -> None:
    node: list[object] = ["prop", "x", 1, 1, 1]
    for _ in range(5 * MAX_NESTING):
        node = ["un", "NOT", node, 1, 1, 1]
    wire = {**over_the_wire(ROUTES["all"]), "condition": node}  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="nested deeper"):
        route_from_wire(wire)


PROBE = """
import json, sys
from edgehub.routing import Router
from edgehub.routing.wire import route_from_wire
trees = {name: route_from_wire(tree) for name, tree in json.loads(sys.argv[1]).items()}
router = Router({name: "(parsed elsewhere)" for name in trees}, trees=trees)
print(len(router.routes), "lark" in sys.modules)
"""


def test_routes_compiled_from_trees_never_load_lark() -> None:
    trees = json.dumps({name: over_the_wire(text) for name, text in ROUTES.items()})
    out = subprocess.run([sys.executable, "-c", PROBE, trees], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(len(ROUTES)), "False"]
