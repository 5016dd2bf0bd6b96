"""Module twins from a deployment and twin change notifications, over the real hub facade and store."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgehub.core import Identity
from edgehub.hub.facade import EdgeHub
from edgehub.hub.twins import merge_diff, merged
from edgehub.routing import Router
from edgehub.store import Store

pytestmark = pytest.mark.timeout(30)

FILTER = Identity.parse("edge/filter")
SINK = "/modules/sink/inputs/twins"

json_leaf = st.one_of(st.integers(-100, 100), st.text(max_size=3), st.booleans())
documents = st.recursive(
    st.dictionaries(st.text("abc", max_size=2), json_leaf, max_size=3),
    lambda inner: st.dictionaries(st.text("abc", max_size=2), st.one_of(json_leaf, inner), max_size=3),
    max_leaves=10,
)


@given(documents, documents)
def test_merge_diff_gives_the_patch_that_turns_one_document_into_the_other(old: Any, new: Any) -> None:
    assert merged(old, merge_diff(old, new)) == new


def test_merge_diff_of_equal_documents_is_empty_and_a_type_change_is_given_whole() -> None:
    assert merge_diff({"a": {"b": 1}}, {"a": {"b": 1}}) == {}
    assert merge_diff({"a": 1}, {"a": True}) == {"a": True}
    assert merge_diff({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}}) == {"a": {"c": None}}


async def test_a_module_gets_the_deployments_desired_properties_on_twin_get() -> None:
    async with EdgeHub(store=Store.in_memory(), router=Router({}), host_name="h") as hub:
        assert (await hub.get_twin(FILTER))["desired"] == {"$version": 1}
        hub.set_module_desired("filter", {"threshold": 25}, 4)
        twin = await hub.get_twin(FILTER)
        assert twin["desired"] == {"threshold": 25, "$version": 4}
        assert (await hub.get_twin(Identity.parse("edge/other")))["desired"] == {"$version": 1}
        hub.set_module_desired("filter", None, 5)
        assert (await hub.get_twin(FILTER))["desired"] == {"$version": 1}


async def test_a_reported_patch_is_routed_as_a_twin_change_notification() -> None:
    router = Router({"n": f'FROM /twinChangeNotifications INTO BrokeredEndpoint("{SINK}")'})
    store = Store.in_memory()
    async with EdgeHub(store=store, router=router, host_name="h") as hub:
        version = await hub.update_reported(FILTER, b'{"applied": 30, "$ignored": 1}')
        [queue] = store.queues(SINK)
        [item] = store.read(queue, 0, 10)
        message = item.message
        assert message.source == "/twinChangeNotifications"
        assert json.loads(message.body) == {"version": version, "properties": {"reported": {"applied": 30}}}
        assert message.properties["moduleId"] == "filter"
        assert message.system_properties["connectionModuleId"] == "filter"
