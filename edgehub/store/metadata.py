"""The store's metadata: durable key -> bytes values in the ``meta`` family for the hub (identities, twins, the
duplicate window), beside the store's own counters under ``stats/``.

Invariants: keys under ``stats/`` belong to the store (``edgehub.store.usage``) and are refused here; metadata
carried by an enqueue (``ops``) is written in that enqueue's group write, so it is durable exactly when the
message is.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgehub.store.backend import Backend, Op
from edgehub.store.maintenance import Maintenance
from edgehub.store.records import META

__all__ = ["Metadata"]

_OWN = "stats/"


def _check(key: str) -> None:
    if key.startswith(_OWN):
        raise ValueError("stats/ keys belong to the store")


class Metadata:
    def __init__(self, backend: Backend, maintenance: Maintenance) -> None:
        self._b = backend
        self._maint = maintenance

    def get(self, key: str) -> bytes | None:
        return self._b.get(META, key.encode())

    def items(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every (key, value) whose key starts with ``prefix`` (e.g. ``identity/``), in key order."""
        if not prefix or prefix.startswith(_OWN):
            raise ValueError("give a prefix outside the store's own stats/ keys")
        p = prefix.encode()
        out = []
        for k, v in self._b.scan(META, p, 1 << 30):
            if not k.startswith(p):
                break
            out.append((k.decode(), v))
        return out

    async def put(self, key: str, value: bytes | None) -> None:
        """Set (or, with None, delete) a value durably."""
        _check(key)
        await self._maint.write_plain([(META, key.encode(), value)])

    @staticmethod
    def ops(metadata: Mapping[str, bytes | None] | None) -> list[Op]:
        """The ops setting (None: deleting) these keys, for an enqueue's group write."""
        if not metadata:
            return []
        for k in metadata:
            _check(k)
        return [(META, k.encode(), v) for k, v in metadata.items()]
