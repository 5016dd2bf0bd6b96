"""The RocksDB backend, through rocksdict in raw mode. The only module that imports rocksdict; every error it
raises is translated here: a refused write becomes ``StorageIOError`` (the batch is atomic, so nothing of it
was applied and the store stays usable), use after close becomes ``StoreClosedError``.

A synced write is a plain write followed by ``flush_wal(True)`` (RocksDB's FlushWAL with sync, i.e. SyncWAL),
not a write with ``sync=True``: rocksdict holds the GIL through ``write`` (fsync included), so the event loop
stood still for every group commit's fsync (~0.7 ms each here), while it lets go of the GIL in ``flush_wal``.
Both are durable when they return (RocksDB's WAL guide). The difference: the batch is visible to readers of the
database from the write on, before it is durable. The store answers producers, and hands the new references to
its executors, only once this returns; an executor's read of the database may see them a little earlier, and a
crash in between can only make a message delivered whose producer was never acknowledged (and so sends it
again): at least once, as always. If the sync fails, the batch is applied but maybe not on disk: the write
raises ``StorageIOError`` and the store reopens before the next write, as after any failed write (the WAL
replays what reached it). ``python -m bench.store_sync`` measures the event loop's stalls both ways.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rocksdict

from edgehub.core import StorageIOError, StoreClosedError, StoreError
from edgehub.store.backend import DeleteTo, Op
from edgehub.store.store import Store

__all__ = ["RocksBackend", "open_rocks_store"]

log = logging.getLogger(__name__)


# All memtables together stay under this, whatever the number of queues (column families): a gateway has
# little memory, and the WAL already makes every write durable.
_DB_WRITE_BUFFER_BYTES = 32 << 20


def _options() -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_db_write_buffer_size(_DB_WRITE_BUFFER_BYTES)
    return opts


class RocksBackend:
    """A RocksDB database at ``path``; column families are created on first use."""

    def __init__(self, path: str | Path) -> None:
        self._path = str(path)
        Path(self._path).mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # guards family creation and reopening; RocksDB itself is thread safe
        self._nosync = rocksdict.WriteOptions()
        self._closed = False
        self._failed = False
        self._open()

    def _open(self) -> None:
        try:
            names = rocksdict.Rdict.list_cf(self._path, rocksdict.Options(raw_mode=True))
        except Exception:
            names = ["default"]  # a new database
        try:
            self._db = rocksdict.Rdict(
                self._path, _options(), column_families={n: rocksdict.Options(raw_mode=True) for n in names}
            )
        except Exception as exc:
            raise StorageIOError(f"cannot open store at {self._path}: {exc}") from exc
        self._cfs: dict[str, rocksdict.Rdict] = {n: self._db.get_column_family(n) for n in names}
        self._handles = {n: self._db.get_column_family_handle(n) for n in names}

    def _recover(self) -> None:
        """After a failed write RocksDB refuses every later write (a sticky background error) and rocksdict
        offers no ``Resume``; closing and reopening replays the WAL without the failed batch."""
        with self._lock:
            if not self._failed:
                return
            self._cfs.clear()
            self._handles.clear()
            db = getattr(self, "_db", None)
            if db is not None:
                try:
                    db.close()
                except Exception as exc:
                    log.info("store.close_after_failure path=%s error=%s", self._path, exc)
                # close() raised before releasing the database: dropping the last reference releases its LOCK
                del self._db, db
                gc.collect()
            self._open()
            self._failed = False
            log.info("store.reopened_after_failure path=%s", self._path)

    def _live(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self._path} is closed")

    def families(self) -> list[str]:
        self._live()
        return list(self._cfs)

    def ensure_family(self, name: str) -> None:
        self._live()
        if name in self._cfs:
            return
        with self._lock:
            if name in self._cfs:
                return
            try:
                cf = self._db.create_column_family(name, rocksdict.Options(raw_mode=True))
            except Exception as exc:
                raise StorageIOError(f"cannot create column family {name!r}: {exc}") from exc
            self._handles[name] = self._db.get_column_family_handle(name)
            self._cfs[name] = cf

    def get(self, family: str, key: bytes) -> bytes | None:
        self._live()
        cf = self._cfs.get(family)
        if cf is None:
            return None
        value = cf.get(key)
        return None if value is None else bytes(value)

    def multi_get(self, family: str, keys: Sequence[bytes]) -> list[bytes | None]:
        self._live()
        cf = self._cfs.get(family)
        if cf is None or not keys:
            return [None] * len(keys)
        values = cf.get(list(keys))
        return [None if v is None else bytes(v) for v in (values or [])]

    def scan(self, family: str, from_key: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        self._live()
        cf = self._cfs.get(family)
        if cf is None or limit <= 0:
            return []
        it = cf.iter()
        it.seek(from_key)
        out: list[tuple[bytes, bytes]] = []
        while it.valid() and len(out) < limit:
            out.append((it.key(), it.value()))
            it.next()
        return out

    def last_key(self, family: str) -> bytes | None:
        self._live()
        cf = self._cfs.get(family)
        if cf is None:
            return None
        it = cf.iter()
        it.seek_to_last()
        return bytes(it.key()) if it.valid() else None

    def write(self, ops: Sequence[Op], *, sync: bool) -> None:
        self._live()
        if self._failed:
            self._recover()
        batch = self._batch(ops)
        try:
            self._db.write(batch, self._nosync)
            if sync:
                self._db.flush_wal(True)  # the fsync, without the GIL (see the module docstring)
        except rocksdict.DbClosedError as exc:
            raise StoreClosedError(f"the store at {self._path} is closed") from exc
        except Exception as exc:
            log.warning("store.write_failed path=%s error=%s", self._path, exc)
            self._failed = True
            raise StorageIOError(f"write to {self._path} failed: {exc}") from exc

    def _batch(self, ops: Sequence[Op]) -> rocksdict.WriteBatch:
        """The write batch of ``ops``, in one pass (two or three ops per message stored). A function of its own:
        its locals hold column family handles, which keep the database open, and a failed write's traceback
        must not (``_recover`` reopens it)."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        handles = self._handles
        for family, key, value in ops:
            handle = handles.get(family)
            if handle is None:
                self.ensure_family(family)
                handle = handles[family]
            if value is None:
                batch.delete(key, handle)
            elif isinstance(value, DeleteTo):
                batch.delete_range(key, value.end, handle)
            else:
                batch.put(key, value, handle)
        return batch

    def sync_wal(self) -> None:
        self._live()
        try:
            self._db.flush_wal(True)
        except Exception as exc:
            self._failed = True
            raise StorageIOError(f"sync of {self._path} failed: {exc}") from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._failed:
            # a clean close leaves nothing in memtables, so the next open replays no WAL (fast recovery)
            for cf in self._cfs.values():
                try:
                    cf.flush(True)
                except Exception as exc:
                    # nothing is lost: the WAL holds it and the next open replays it
                    log.warning("store.flush_failed path=%s error=%s", self._path, exc)
                    self._failed = True
                    break
        self._cfs.clear()
        self._handles.clear()
        try:
            self._db.close()
        except Exception as exc:
            if not self._failed:
                raise StoreError(f"close of {self._path} failed: {exc}") from exc


def open_rocks_store(path: str | Path, **settings: Any) -> Store:
    """A ``Store`` over a RocksDB database at ``path`` (created if missing); ``settings`` as ``Store`` takes them.

    Kept here, not on ``Store``, so that importing ``edgehub.store`` never loads rocksdict (layer contract)."""
    return Store(RocksBackend(path), **settings)
