"""An in-memory ``SegmentWriter`` that tests steer: it fails the next N writes, or stalls until released.

It keeps what a landing zone promises: a name written twice keeps its first bytes (``writes`` counts every
call, ``segments`` holds one entry per name; ``files`` the same for what is not a segment, e.g. dictionaries;
``order`` every path as first stored). A failed write stores nothing.
"""

from __future__ import annotations

import threading

from edgehub.core import FailureKind, TransportError
from edgehub.upstream.segment import SegmentName

__all__ = ["MemorySegmentStore"]


class MemorySegmentStore:
    """Implements ``edgehub.upstream.upload_transport.SegmentWriter``. Thread-safe (writes come from a worker)."""

    def __init__(self) -> None:
        self.segments: dict[str, bytes] = {}
        self.files: dict[str, bytes] = {}
        self.order: list[str] = []
        self.writes = 0
        self._fail_next = 0
        self._fail_kind = FailureKind.TRANSIENT
        self._lock = threading.Lock()

    def fail_next(self, count: int, kind: FailureKind = FailureKind.TRANSIENT) -> None:
        """Make the next ``count`` writes raise ``TransportError(kind)``."""
        with self._lock:
            self._fail_next, self._fail_kind = count, kind

    def write(self, name: SegmentName, data: bytes) -> str:
        return self._store(self.segments, name.path, data)

    def write_path(self, relative_path: str, data: bytes) -> str:
        return self._store(self.files, relative_path, data)

    def _store(self, into: dict[str, bytes], path: str, data: bytes) -> str:
        with self._lock:
            self.writes += 1
            if self._fail_next > 0:
                self._fail_next -= 1
                raise TransportError(f"memory landing: injected failure for {path}", kind=self._fail_kind)
            if path not in into:
                into[path] = data
                self.order.append(path)
            return path
