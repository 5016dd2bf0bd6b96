"""Reported-properties patches against IoT Hub's limits: the parser refuses with a status and a reason, never
with anything else (Hypothesis), measures depth without recursion, and the hub's twins merge in memory, refuse
a patch that would make the document too large without changing it, and come back from the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgehub.core import Identity, TwinError
from edgehub.core.refusals import RefusalReason
from edgehub.hub.facade import EdgeHub
from edgehub.hub.twins import DEFAULT_TWIN_LIMITS, TwinLimits, check_patch, parse_reported_patch
from edgehub.routing import Router
from edgehub.store import Store
from edgehub.store.rocks import open_rocks_store

pytestmark = pytest.mark.timeout(60)

DEV = Identity.parse("dev1")
WIDE = TwinLimits(max_patch_bytes=1 << 20)  # lets a deep patch past the size check, to reach the depth check


def deep(levels: int, opener: str = '{"a":', closer: str = "}") -> bytes:
    return (opener * levels + "1" + closer * levels).encode()


def refusal(raw: bytes, limits: TwinLimits = DEFAULT_TWIN_LIMITS) -> tuple[int, RefusalReason]:
    with pytest.raises(TwinError) as caught:
        parse_reported_patch(raw, limits)
    return caught.value.status, caught.value.refusal


def test_a_100000_deep_patch_is_refused_as_too_deep_without_recursion() -> None:
    assert refusal(deep(100_000), WIDE) == (400, RefusalReason.TWIN_TOO_DEEP)
    assert refusal(deep(100_000, "[", "]"), WIDE) == (400, RefusalReason.TWIN_TOO_DEEP)
    # Brackets inside strings are text, not nesting.
    assert parse_reported_patch(json.dumps({"s": "{[" * 5000}).encode(), WIDE) == {"s": "{[" * 5000}


def test_depth_ten_below_the_patch_is_taken_and_eleven_is_not() -> None:
    assert parse_reported_patch(deep(11)) == json.loads(deep(11))  # the patch's object and 10 levels below it
    assert refusal(deep(12)) == (400, RefusalReason.TWIN_TOO_DEEP)
    check_patch({"a": json.loads(deep(10))})
    with pytest.raises(TwinError, match="nests over 10"):
        check_patch({"a": json.loads(deep(11))})


def test_a_deep_mapping_from_a_caller_is_refused_without_recursion() -> None:
    node: dict[str, object] = {}
    root = node
    for _ in range(100_000):
        child: dict[str, object] = {}
        node["a"] = child
        node = child
    with pytest.raises(TwinError) as caught:
        check_patch(root)
    assert caught.value.refusal is RefusalReason.TWIN_TOO_DEEP


def test_a_patch_over_32_kb_is_refused_as_too_large_before_it_is_parsed() -> None:
    assert refusal(b'{"blob": "' + b"x" * 40_000 + b'"}') == (413, RefusalReason.TWIN_TOO_LARGE)
    assert refusal(deep(100_000)) == (413, RefusalReason.TWIN_TOO_LARGE)


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe{}",
        b"[1, 2]",
        b'"text"',
        b"{",
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": 1' + b"0" * 5000 + b"}",
        b'{"a": 4503599627370496}',
        b'{"' + b"k" * 1025 + b'": 1}',
        b'{"a": {"$b": 1}}',
        b'{"\\ud800": 1}',
        b'{"a": "\\udfff"}',
        ("{" + ",".join(f'"k{i}": 1' for i in range(2049)) + "}").encode(),
    ],
    ids=[
        "not-utf8",
        "array",
        "string",
        "truncated",
        "nan",
        "infinity",
        "5000-digit-int",
        "int-over-2**52",
        "long-key",
        "dollar-key-below-top",
        "surrogate-key",
        "surrogate-value",
        "2049-keys",
    ],
)
def test_malformed_patches_are_refused_as_invalid(raw: bytes) -> None:
    assert refusal(raw) == (400, RefusalReason.TWIN_INVALID)


def test_an_empty_patch_is_an_empty_object_and_top_level_dollar_keys_pass() -> None:
    assert parse_reported_patch(b"") == {}
    assert parse_reported_patch(b'{"$version": 4, "fw": "1.0"}') == {"$version": 4, "fw": "1.0"}


# -- Hypothesis: only declared errors ------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=30,
)
_fragments = st.sampled_from(['{"a":', "[", "]", "}", "{", '"', "\\", '\\"', ",", ":", "1", "null", "NaN", "\\ud800"])


def _deep_text(data: tuple[int, str, str]) -> bytes:
    levels, opener, closer = data
    return (opener * levels + closer * levels).encode()


_patches = st.one_of(
    st.binary(max_size=300),
    _json_values.map(lambda v: json.dumps(v).encode()),
    st.lists(_fragments, max_size=60).map(lambda parts: "".join(parts).encode()),
    st.tuples(st.integers(0, 50_000), st.sampled_from(['{"a":', "[", '{"b":[']), st.sampled_from(["}", "]", "]}"])).map(
        _deep_text
    ),
)


@settings(max_examples=500, deadline=None)
@given(_patches, st.sampled_from([TwinLimits(), WIDE]))
def test_parsing_any_bytes_gives_a_patch_or_a_declared_refusal(raw: bytes, limits: TwinLimits) -> None:
    refused: TwinError | None = None
    try:
        patch = parse_reported_patch(raw, limits)
    except TwinError as exc:
        refused = exc
    if refused is not None:
        assert refused.status in (400, 413)
        assert refused.refusal in {
            RefusalReason.TWIN_INVALID,
            RefusalReason.TWIN_TOO_DEEP,
            RefusalReason.TWIN_TOO_LARGE,
        }
        return
    assert isinstance(patch, dict)
    json.dumps(patch).encode()  # what was taken can be written back


# -- the hub's twins -----------------------------------------------------------------------------------------


def hub_over(store: Store, limits: TwinLimits = DEFAULT_TWIN_LIMITS) -> EdgeHub:
    return EdgeHub(
        store=store, router=Router({"all": "FROM /* INTO $upstream"}), host_name="hub.test", twin_limits=limits
    )


async def test_a_patch_that_would_make_reported_too_large_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    store = open_rocks_store(tmp_path / "s")
    async with hub_over(store) as hub:
        assert await hub.update_reported(DEV, b'{"fw": "1.0"}') == 2
        for i in range(3):  # three of 10 KB fit in 32 KB
            assert await hub.update_reported(DEV, json.dumps({f"part{i}": "x" * 10_000}).encode()) == 3 + i
        with pytest.raises(TwinError) as caught:
            await hub.update_reported(DEV, json.dumps({"part3": "x" * 10_000}).encode())
        assert (caught.value.status, caught.value.refusal) == (413, RefusalReason.TWIN_TOO_LARGE)
        twin = await hub.get_twin(DEV)
        assert twin["reported"]["$version"] == 5
        assert "part3" not in twin["reported"]
        # Deleting makes room again (null deletes, as in IoT Hub).
        assert await hub.update_reported(DEV, b'{"part0": null, "part3": "' + b"y" * 10_000 + b'"}') == 6
        with pytest.raises(TwinError):
            await hub.update_reported(DEV, deep(20))
        assert hub.refusals.total == 2
    await store.close()
    store = open_rocks_store(tmp_path / "s")
    async with hub_over(store) as hub:  # the store is the source of truth after a restart
        twin = await hub.get_twin(DEV)
        assert twin["reported"]["$version"] == 6
        assert set(twin["reported"]) == {"$version", "fw", "part1", "part2", "part3"}
    await store.close()


async def test_twins_that_fell_out_of_the_cache_are_read_back_from_the_store() -> None:
    async with hub_over(Store.in_memory(), TwinLimits(max_cached=1)) as hub:
        devices = [Identity.parse(f"d{i}") for i in range(5)]
        for round_ in range(3):
            for d in devices:
                assert await hub.update_reported(d, {"round": round_, "net": {"rssi": -round_}}) == round_ + 2
        for d in devices:
            assert (await hub.get_twin(d))["reported"] == {"$version": 4, "round": 2, "net": {"rssi": -2}}


async def test_a_refused_merge_leaves_the_cached_twin_as_it_was() -> None:
    async with hub_over(Store.in_memory(), TwinLimits(max_reported_bytes=200)) as hub:
        assert await hub.update_reported(DEV, {"net": {"rssi": -60, "ssid": "ship"}}) == 2
        with pytest.raises(TwinError):
            await hub.update_reported(DEV, {"net": {"note": "x" * 300}})
        assert (await hub.get_twin(DEV))["reported"] == {"$version": 2, "net": {"rssi": -60, "ssid": "ship"}}
