"""What the deployment controller keeps and reports: the JSON merge patch (RFC 7386), per-queue figures for the
reported properties, the ACL grants as the MQTT head reads them, and the record kept in the store.

Invariants:
* ``merge_patch`` never changes its inputs; ``null`` in a patch deletes the key; a patch that is not an object
  replaces the target (RFC 7386 section 2);
* ``queue_figures`` reads at most ``MAX_SCAN_REFERENCES`` references per queue: a bigger backlog is reported with
  ``"exact": false`` and its length and bytes estimated from the offsets and the part read, so reporting never
  reads a backlog of millions; it lists at most ``MAX_REPORTED_QUEUES`` queues (the longest);
* every key of the reported document is a twin key IoT Hub takes (no ``$``, ``.`` or space): endpoint ids, which
  may hold them, are values in lists, never keys;
* ``LiveGrants`` is a read-only mapping (identity id → topic filters) whose content follows the deployment that
  runs: the MQTT head's ``Acl`` asks it at every publish and subscribe, so new grants take effect on running
  connections at once;
* the record in the store (``STATE_KEY``) holds the running desired properties, the module twins, the reported
  properties and the manifest file's fingerprint; it is JSON, bounded by the manifest's own bounds.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from edgehub.core import Identity
from edgehub.manifest.grants import Grant
from edgehub.store import Store

__all__ = [
    "MAX_REPORTED_QUEUES",
    "MAX_SCAN_REFERENCES",
    "STATE_KEY",
    "LiveGrants",
    "decode_state",
    "encode_state",
    "merge_patch",
    "queue_figures",
]

STATE_KEY = "deployment/state"
MAX_SCAN_REFERENCES = 100_000
MAX_REPORTED_QUEUES = 64  # IoT Hub keeps 32 KB of reported properties: about 100 bytes a queue


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch of ``target`` by ``patch`` (a new value; the inputs are not changed)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def queue_figures(store: Store, now_s: float) -> list[dict[str, object]]:
    """``{endpoint, priority, length, bytes, oldestAgeSecs, exact}`` of each queue that still owes something (past
    its checkpoint), at most ``MAX_REPORTED_QUEUES`` of them, the longest first. A list, not objects keyed by
    endpoint: twin keys may not hold ``$`` or ``.`` (``$upstream``)."""
    out: list[dict[str, object]] = []
    for q in store.queues():
        start = store.checkpoint(q).committed + 1
        end = store.end_offset(q)
        length = size = 0
        oldest: float | None = None
        exact = True
        offset = start
        while offset < end:
            refs = store.references(q, offset, 4096)
            if not refs:
                break
            for r in refs:
                length += 1
                size += r.size_bytes
                if oldest is None:
                    oldest = r.enqueued_at_s
            offset = refs[-1].offset + 1
            if length >= MAX_SCAN_REFERENCES and offset < end:
                exact = False
                rest = end - offset  # offsets left; removed ones (holes) make this an upper bound
                size += size * rest // max(1, length)
                length += rest
                break
        if length:
            age = round(max(0.0, now_s - oldest), 3) if oldest is not None else None
            out.append(
                {
                    "endpoint": q.endpoint,
                    "priority": q.priority,
                    "length": length,
                    "bytes": size,
                    "oldestAgeSecs": age,
                    "exact": exact,
                }
            )
    out.sort(key=lambda f: (-int(str(f["length"])), str(f["endpoint"]), int(str(f["priority"]))))
    return out[:MAX_REPORTED_QUEUES]


class LiveGrants(Mapping[str, Sequence[str]]):
    """identity id → the topic filters ``grants`` give it for one operation (see the module docstring)."""

    def __init__(self, operation: str) -> None:
        self._operation = operation
        self._grants: tuple[Grant, ...] = ()

    def update(self, grants: Sequence[Grant]) -> None:
        self._grants = tuple(g for g in grants if g.operation == self._operation)

    def __getitem__(self, identity_id: str) -> Sequence[str]:
        if not self._grants:
            raise KeyError(identity_id)
        try:
            identity = Identity.parse(identity_id)
        except ValueError:
            raise KeyError(identity_id) from None
        filters = [g.topic_filter(identity) for g in self._grants if g.applies_to(identity)]
        if not filters:
            raise KeyError(identity_id)
        return filters

    def __iter__(self) -> Iterator[str]:
        # Grants for every identity cannot be listed: only those named.
        return iter(sorted({g.identity for g in self._grants if g.identity is not None}))

    def __len__(self) -> int:
        return len({g.identity for g in self._grants if g.identity is not None})


def encode_state(state: Mapping[str, Any]) -> bytes:
    return json.dumps(state, separators=(",", ":"), sort_keys=True).encode("utf-8")


def decode_state(raw: bytes | None) -> dict[str, Any] | None:
    """The record kept in the store, or None when there is none or it cannot be read (then it is rebuilt)."""
    if raw is None:
        return None
    try:
        state = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return state if isinstance(state, dict) else None
