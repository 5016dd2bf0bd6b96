"""The key-value seam under the store: column families of sorted byte keys, atomic write batches.

Two implementations: ``RocksBackend`` (``rocks.py``, the only place rocksdict is imported) and
``MemoryBackend`` here. Both give the same guarantees: a ``write`` is atomic (all of it or none of it),
``sync=True`` returns only once the batch is on disk (memory: at once), ``scan`` returns keys in byte order.
Errors: ``StorageIOError`` when the disk refuses a write, ``StoreClosedError`` after ``close``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from edgehub.core import StoreClosedError

__all__ = ["Backend", "DeleteTo", "MemoryBackend", "Op"]


class DeleteTo(NamedTuple):
    """An op's value that deletes every key of its family from the op's key up to ``end`` (excluded): one range
    deletion instead of a deletion per key (the store removes a commit's delivered references and bodies so,
    when their keys are consecutive)."""

    end: bytes


# (family, key, value): value None deletes the key; DeleteTo(end) deletes [key, end).
Op = tuple[str, bytes, bytes | DeleteTo | None]


class Backend(Protocol):
    def families(self) -> list[str]: ...

    def ensure_family(self, name: str) -> None: ...

    def get(self, family: str, key: bytes) -> bytes | None: ...

    def multi_get(self, family: str, keys: Sequence[bytes]) -> list[bytes | None]: ...

    def scan(self, family: str, from_key: bytes, limit: int) -> list[tuple[bytes, bytes]]: ...

    def last_key(self, family: str) -> bytes | None: ...

    def write(self, ops: Sequence[Op], *, sync: bool) -> None: ...

    def sync_wal(self) -> None: ...

    def drop_overwritten(self, family: str) -> None:
        """Make the values overwritten or deleted in ``family`` leave the files on disk (a secret replaced in
        place must not linger in an old table or log file); nothing changes what reads return."""
        ...

    def close(self) -> None: ...


class MemoryBackend:
    """Column families as dicts with a sorted key list. Nothing survives the process."""

    def __init__(self) -> None:
        self._data: dict[str, dict[bytes, bytes]] = {}
        self._keys: dict[str, list[bytes]] = {}
        self._closed = False

    def _live(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    def families(self) -> list[str]:
        self._live()
        return list(self._data)

    def ensure_family(self, name: str) -> None:
        self._live()
        self._data.setdefault(name, {})
        self._keys.setdefault(name, [])

    def get(self, family: str, key: bytes) -> bytes | None:
        self._live()
        return self._data.get(family, {}).get(key)

    def multi_get(self, family: str, keys: Sequence[bytes]) -> list[bytes | None]:
        self._live()
        d = self._data.get(family, {})
        return [d.get(k) for k in keys]

    def scan(self, family: str, from_key: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        self._live()
        keys = self._keys.get(family, [])
        d = self._data.get(family, {})
        i = bisect.bisect_left(keys, from_key)
        # tolerate a key deleted by a concurrent write (reads may run in a worker thread)
        rows = [(k, d.get(k)) for k in keys[i : i + limit]]
        return [(k, v) for k, v in rows if v is not None]

    def last_key(self, family: str) -> bytes | None:
        self._live()
        keys = self._keys.get(family, [])
        return keys[-1] if keys else None

    def write(self, ops: Sequence[Op], *, sync: bool) -> None:
        self._live()
        for family, key, value in ops:
            self.ensure_family(family)
            d, keys = self._data[family], self._keys[family]
            if value is None:
                if d.pop(key, None) is not None:
                    del keys[bisect.bisect_left(keys, key)]
            elif isinstance(value, DeleteTo):
                lo, hi = bisect.bisect_left(keys, key), bisect.bisect_left(keys, value.end)
                for k in keys[lo:hi]:
                    del d[k]
                del keys[lo:hi]
            else:
                if key not in d:
                    bisect.insort(keys, key)
                d[key] = value

    def sync_wal(self) -> None:
        self._live()

    def drop_overwritten(self, family: str) -> None:
        self._live()  # nothing on disk

    def reopened(self) -> MemoryBackend:
        """A new backend over the same data, as a restart would see it (for tests of reopen behaviour)."""
        fresh = MemoryBackend()
        # Its own class's state, as a __copy__ would share it: a restart sees the same data, not a copy of it.
        fresh._data, fresh._keys = self._data, self._keys
        return fresh

    def close(self) -> None:
        self._closed = True
