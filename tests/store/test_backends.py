"""The backend seam's range deletion, over both backends alike: ``DeleteTo(end)`` removes [key, end) of its
family and nothing else, atomically with the rest of its batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgehub.store import Backend, DeleteTo, MemoryBackend
from edgehub.store.codec import pack_u64
from edgehub.store.maintenance import deletions
from edgehub.store.rocks import RocksBackend


@pytest.fixture(params=["memory", "rocksdb"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return MemoryBackend() if request.param == "memory" else RocksBackend(tmp_path / "db")


def keys(b: Backend, family: str) -> list[int]:
    return [int.from_bytes(k, "big") for k, _ in b.scan(family, pack_u64(0), 100)]


def test_delete_to_removes_the_range_of_its_family_only_with_the_rest_of_its_batch(backend: Backend) -> None:
    try:
        backend.write([(f, pack_u64(i), b"v%d" % i) for f in ("a", "b") for i in range(10)], sync=True)
        backend.write(
            [
                ("a", pack_u64(2), DeleteTo(pack_u64(6))),  # 2, 3, 4, 5
                ("a", pack_u64(8), None),
                ("a", pack_u64(20), DeleteTo(pack_u64(30))),  # nothing there: not an error
                ("b", pack_u64(9), b"new"),
            ],
            sync=True,
        )
        assert keys(backend, "a") == [0, 1, 6, 7, 9]
        assert keys(backend, "b") == list(range(10))  # the other family is untouched
        assert backend.get("b", pack_u64(9)) == b"new"
        assert backend.multi_get("a", [pack_u64(5), pack_u64(6)]) == [None, b"v6"]
        assert backend.last_key("a") == pack_u64(9)
        backend.write([("a", pack_u64(0), DeleteTo(pack_u64(100)))], sync=True)
        assert keys(backend, "a") == []
        assert backend.last_key("a") is None
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([4, 5, 6], [(4, 7)]),  # a run: one range deletion
        ([6, 4, 5], [(4, 7)]),  # the same run in another order
        ([1, 5, 3], [(1, None), (5, None), (3, None)]),  # ends 1 and 3 look like a run of three: they are not
        ([7], [(7, 8)]),
    ],
)
def test_a_commits_deletions_take_a_range_only_when_the_keys_fill_it(
    ids: list[int], expected: list[tuple[int, int | None]]
) -> None:
    ops = deletions("m", ids)
    got = [
        (int.from_bytes(k, "big"), int.from_bytes(v.end, "big") if isinstance(v, DeleteTo) else v) for _, k, v in ops
    ]
    assert got == expected
