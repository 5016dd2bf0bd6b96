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

A full disk: the reopen after a failed write needs room too (RocksDB writes a table of the replayed WAL and a new
MANIFEST), so while the disk stays full it fails; the store then opens the database read-only, so that what it
holds can still be read and delivered, and tries a read-write open again at the next write, at most once a
second (``_REOPEN_INTERVAL_S``); writes in between fail at once with ``StorageIOError``.

A damaged store is refused, never opened with acknowledged messages missing (``StoreCorruptionError``, naming the
path and the damage): paranoid checks are on; the WAL is replayed with ``kTolerateCorruptedTailRecords``, so an
incomplete last record (a write a crash cut short, never acknowledged: acks follow the sync) is dropped and
anything else wrong refuses the open (RocksDB's default, point-in-time recovery, would stop at a corruption in
the middle of the WAL and open with every later write gone); a CURRENT that is missing while tables or logs are
there, or that names a missing MANIFEST, is refused before RocksDB would create a new, empty database over it. A
truncated WAL ends like a torn write, so RocksDB cannot tell them apart: at most once a second after a sync the
backend records the WAL's size from before that sync in ``EDGEHUB-WAL-SYNCED`` (the file and a size, never more
than is on disk), and an open that finds that WAL shorter refuses. ``verify`` reads every record with its
checksum (a flipped byte in a table is found only by reading it; the hub does it at start, read-only), and a read
that meets damage raises ``StoreCorruptionError``. ``edgehub.store.salvage`` checks and repairs a damaged store.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rocksdict

from edgehub.core import StorageIOError, StoreClosedError, StoreCorruptionError, StoreError
from edgehub.store.backend import DeleteTo, Op
from edgehub.store.store import Store
from edgehub.store.tuning import RocksTuning

__all__ = ["INFO_LOGS_KEPT", "INFO_LOG_MAX_BYTES", "WAL_MARK", "RocksBackend", "open_rocks_store", "repair_db"]

log = logging.getLogger(__name__)


_REOPEN_INTERVAL_S = 1.0  # while the disk stays full, a read-write reopen is tried at most this often
WAL_MARK = "EDGEHUB-WAL-SYNCED"  # "<wal file name> <bytes synced>", in the store's folder
_WAL_MARK_INTERVAL_S = 1.0
# RocksDB's info log: rolled at this size, this many files kept (LOG and its LOG.old.*): at most ~6 MiB of a card.
INFO_LOG_MAX_BYTES = 1 << 20
INFO_LOGS_KEPT = 5


class _Budget:
    """``RocksTuning`` as RocksDB options: the database's, and each column family's (memtable sizes and the table
    factory are per family; one block cache object is shared by all, and kept across reopens)."""

    def __init__(self, tuning: RocksTuning) -> None:
        self.tuning = tuning
        self._cache = rocksdict.Cache(tuning.block_cache_bytes) if tuning.block_cache_bytes is not None else None

    def db(self, *, salvage: bool = False) -> rocksdict.Options:
        opts = self.family()
        opts.set_db_write_buffer_size(self.tuning.db_write_buffer_bytes)
        if self.tuning.max_open_files is not None:
            opts.set_max_open_files(self.tuning.max_open_files)
        if self.tuning.max_background_jobs is not None:
            opts.set_max_background_jobs(self.tuning.max_background_jobs)
        return _options(opts, salvage=salvage)

    def family(self) -> rocksdict.Options:
        t = self.tuning
        opts = rocksdict.Options(raw_mode=True)
        if t.write_buffer_bytes is not None:
            opts.set_write_buffer_size(t.write_buffer_bytes)
        if t.max_write_buffers is not None:
            opts.set_max_write_buffer_number(t.max_write_buffers)
        if self._cache is not None:
            table = rocksdict.BlockBasedOptions()
            table.set_block_cache(self._cache)
            # index and filter blocks inside the budget, not beside it (one per table file otherwise)
            table.set_cache_index_and_filter_blocks(True)
            table.set_pin_l0_filter_and_index_blocks_in_cache(True)
            opts.set_block_based_table_factory(table)
        return opts

    def cache_usage(self) -> int | None:
        return None if self._cache is None else self._cache.get_usage()


def _options(opts: rocksdict.Options | None = None, *, salvage: bool = False) -> rocksdict.Options:
    """The database options every open takes, over ``opts`` (the memory budget's) or RocksDB's defaults."""
    if opts is None:
        opts = rocksdict.Options(raw_mode=True)
        opts.set_db_write_buffer_size(RocksTuning().db_write_buffer_bytes)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_paranoid_checks(not salvage)
    # RocksDB's info log (LOG, a statistics dump every 10 minutes) is unbounded by default: the file grows without
    # end and each open keeps the last as LOG.old.* up to 1000 of them. A gateway runs for years on a small card.
    opts.set_max_log_file_size(INFO_LOG_MAX_BYTES)
    opts.set_keep_log_file_num(INFO_LOGS_KEPT)
    # salvage: every WAL record that is whole, past any damaged one (a copy of the damaged store is kept)
    mode = rocksdict.DBRecoveryMode
    opts.set_wal_recovery_mode(mode.skip_any_corrupted_record() if salvage else mode.tolerate_corrupted_tail_records())
    return opts


def _damaged(path: str, what: str) -> StoreCorruptionError:
    return StoreCorruptionError(f"the store at {path} is damaged: {what}", path=path)


def _error(path: str, exc: Exception, doing: str) -> StoreError:
    """RocksDB's error of ``doing`` as ours: damage (a corruption, a file it needs gone), a store another process
    holds, or the disk refusing."""
    text = str(exc)
    if "Corruption" in text or "No such file" in text:
        return _damaged(path, text)
    if "lock file" in text:  # "While lock file: .../LOCK: Resource temporarily unavailable"
        return StorageIOError(f"the store at {path} is in use by another process (a running hub?): {text}")
    return StorageIOError(f"{doing} {path} failed: {text}")


def _check_files(path: Path) -> None:
    """Refuse damage RocksDB would not: a CURRENT that is missing or names a missing MANIFEST (with
    ``create_if_missing`` RocksDB would make a new, empty database over the old files), a WAL shorter than was
    synced (``WAL_MARK``)."""
    current = path / "CURRENT"
    if not current.is_file():
        data = sorted(
            n for n in os.listdir(path) if n.endswith(".sst") or (n.endswith(".log") and (path / n).stat().st_size)
        )
        if data:
            raise _damaged(
                str(path), f"CURRENT is missing, yet {data[0]} and {len(data) - 1} more data files are there"
            )
        return
    manifest = current.read_text(errors="replace").strip()
    if not manifest.startswith("MANIFEST-") or "/" in manifest or not (path / manifest).is_file():
        raise _damaged(
            str(path), f"CURRENT names {manifest!r}, which is missing (the MANIFEST lists the store's files)"
        )
    try:
        name, size = (path / WAL_MARK).read_text().split()
        synced = int(size)
    except FileNotFoundError:
        return
    except ValueError:
        log.warning("store.wal_mark_unreadable path=%s", path)  # cut short by a power cut: it checks nothing
        return
    if "/" in name or not name.endswith(".log"):
        return
    try:
        actual = (path / name).stat().st_size
    except FileNotFoundError:
        return  # replayed into a table and deleted: nothing in it is needed any more
    if actual < synced:
        raise _damaged(
            str(path),
            f"the write-ahead log {name} is {actual} bytes, but {synced} bytes of it had been synced: it was "
            "truncated, and the acknowledged messages in the missing part would be lost",
        )


def _current_wal(path: str) -> tuple[str, int] | None:
    """The newest WAL file and its size now."""
    with os.scandir(path) as entries:
        logs = [e for e in entries if e.name.endswith(".log") and e.name[:-4].isdigit()]
    if not logs:
        return None
    newest = max(logs, key=lambda e: int(e.name[:-4]))
    try:
        return newest.name, newest.stat().st_size
    except FileNotFoundError:
        return None


class RocksBackend:
    """A RocksDB database at ``path``; column families are created on first use. ``read_only``: an existing
    database, opened without writing anything (its WAL replayed in memory only). ``salvage`` (read-only too): a
    damaged one, opened as leniently as RocksDB can (WAL records past a damaged one replayed, no paranoid checks,
    no check of CURRENT or the WAL mark), to copy out what can still be read. ``tuning``: RocksDB's memory budget
    (``edgehub.store.tuning``; a hardware profile's)."""

    def __init__(
        self,
        path: str | Path,
        *,
        read_only: bool = False,
        salvage: bool = False,
        tuning: RocksTuning | None = None,
    ) -> None:
        read_only = read_only or salvage
        self._budget = _Budget(tuning or RocksTuning())
        self._salvage = salvage
        self._path = str(path)
        if not read_only:
            Path(self._path).mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # guards family creation and reopening; RocksDB itself is thread safe
        self._nosync = rocksdict.WriteOptions()
        self._closed = False
        self._failed = False
        self._unopened: str | None = None  # why no database is open (a reopen after a failure failed twice)
        self._retry_at = 0.0  # monotonic; a read-write reopen is not tried before
        self._mark_at = 0.0  # monotonic; the WAL mark is not written again before
        self._read_only = read_only
        self._open(read_only=read_only)

    def _open(self, *, read_only: bool = False) -> None:
        if not self._salvage:
            _check_files(Path(self._path))
        names = ["default"]
        if (Path(self._path) / "CURRENT").is_file():
            try:
                names = rocksdict.Rdict.list_cf(self._path, rocksdict.Options(raw_mode=True))
            except Exception as exc:
                raise _error(self._path, exc, "open of") from exc
        access = rocksdict.AccessType.read_only() if read_only else rocksdict.AccessType.read_write()
        try:
            self._db = rocksdict.Rdict(
                self._path,
                self._budget.db(salvage=self._salvage),
                column_families={n: self._budget.family() for n in names},
                access_type=access,
            )
        except Exception as exc:
            raise _error(self._path, exc, "open of") from exc
        # new dicts, not cleared ones: a reader in another thread keeps the ones it took until it is done
        self._cfs: dict[str, rocksdict.Rdict] = {n: self._db.get_column_family(n) for n in names}
        self._handles = {n: self._db.get_column_family_handle(n) for n in names}
        self._unopened = None

    def _recover(self) -> None:
        """After a failed write RocksDB refuses every later write (a sticky background error) and rocksdict
        offers no ``Resume``; closing and reopening replays the WAL without the failed batch. While the disk is
        still full the reopen fails: the database is then opened read-only (reads go on) and the next write
        tries again, once ``_REOPEN_INTERVAL_S`` has passed."""
        with self._lock:
            if not self._failed:
                return
            if time.monotonic() < self._retry_at:
                raise StorageIOError(f"the store at {self._path} takes no writes since a failed one; retrying soon")
            self._drop_db()
            try:
                self._open()
            except StoreError as exc:
                self._retry_at = time.monotonic() + _REOPEN_INTERVAL_S
                log.warning("store.reopen_failed path=%s error=%s", self._path, exc)
                try:
                    self._open(read_only=True)
                except StoreError as again:
                    self._unopened = str(again)
                raise
            self._failed = False
            log.info("store.reopened_after_failure path=%s", self._path)

    def _drop_db(self) -> None:
        self._cfs = {}
        self._handles = {}
        self._unopened = "reopening after a failed write"
        db = getattr(self, "_db", None)
        if db is not None:
            try:
                db.close()
            except Exception as exc:
                log.info("store.close_after_failure path=%s error=%s", self._path, exc)
            # close() raised before releasing the database: dropping the last reference releases its LOCK
            del self._db, db
            gc.collect()

    def _live(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self._path} is closed")
        if self._unopened is not None:
            raise StorageIOError(f"the store at {self._path} is not open: {self._unopened}")

    @property
    def tuning(self) -> RocksTuning:
        return self._budget.tuning

    def memory_usage(self) -> dict[str, int]:
        """RocksDB's memory now, in bytes: memtables (every column family's), the block cache (when the budget
        gives one), table readers (index and filter blocks held outside the cache)."""
        self._live()
        out = {
            "memtables": sum(
                cf.property_int_value("rocksdb.cur-size-all-mem-tables") or 0 for cf in self._cfs.values()
            ),
            "table_readers": sum(
                cf.property_int_value("rocksdb.estimate-table-readers-mem") or 0 for cf in self._cfs.values()
            ),
        }
        cache = self._budget.cache_usage()
        if cache is not None:
            out["block_cache"] = cache
        return out

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
                cf = self._db.create_column_family(name, self._budget.family())
            except Exception as exc:
                raise StorageIOError(f"cannot create column family {name!r}: {exc}") from exc
            self._handles[name] = self._db.get_column_family_handle(name)
            self._cfs[name] = cf

    def get(self, family: str, key: bytes) -> bytes | None:
        self._live()
        cf = self._cfs.get(family)
        if cf is None:
            return None
        try:
            value = cf.get(key)
        except Exception as exc:
            raise _error(self._path, exc, "read of") from exc
        return None if value is None else bytes(value)

    def multi_get(self, family: str, keys: Sequence[bytes]) -> list[bytes | None]:
        self._live()
        cf = self._cfs.get(family)
        if cf is None or not keys:
            return [None] * len(keys)
        try:
            values = cf.get(list(keys))
        except Exception as exc:
            raise _error(self._path, exc, "read of") from exc
        return [None if v is None else bytes(v) for v in (values or [])]

    def scan(self, family: str, from_key: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        self._live()
        cf = self._cfs.get(family)
        if cf is None or limit <= 0:
            return []
        out: list[tuple[bytes, bytes]] = []
        try:
            it = cf.iter()
            it.seek(from_key)
            while it.valid():
                out.append((it.key(), it.value()))
                if len(out) >= limit:
                    break  # not a step further: past the last record asked for may be damage (salvage reads up to it)
                it.next()
            it.status()
        except Exception as exc:
            raise _error(self._path, exc, "read of") from exc
        return out

    def last_key(self, family: str) -> bytes | None:
        self._live()
        cf = self._cfs.get(family)
        if cf is None:
            return None
        try:
            it = cf.iter()
            it.seek_to_last()
            return bytes(it.key()) if it.valid() else None
        except Exception as exc:
            raise _error(self._path, exc, "read of") from exc

    def write(self, ops: Sequence[Op], *, sync: bool) -> None:
        if self._read_only:
            raise ValueError(f"the store at {self._path} was opened read-only")
        if self._failed and not self._closed:
            self._recover()  # before _live: a store left with no database open is reopened here too
        self._live()
        batch = self._batch(ops)
        try:
            self._db.write(batch, self._nosync)
            if sync:
                self._sync()
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

    def _sync(self) -> None:
        """The fsync, without the GIL (see the module docstring); at most once a second, the WAL mark of what it
        made durable (the size read before the sync: never more than is on disk)."""
        now = time.monotonic()
        wal = _current_wal(self._path) if now >= self._mark_at else None
        self._db.flush_wal(True)
        if wal is not None:
            self._mark_at = now + _WAL_MARK_INTERVAL_S
            tmp = os.path.join(self._path, WAL_MARK + ".tmp")
            try:
                with open(tmp, "w") as f:
                    f.write(f"{wal[0]} {wal[1]}\n")
                os.replace(tmp, os.path.join(self._path, WAL_MARK))
            except OSError as exc:  # a full disk: the mark is a check, not the data; the next one may succeed
                log.debug("store.wal_mark_failed path=%s error=%s", self._path, exc)

    def sync_wal(self) -> None:
        self._live()
        try:
            self._sync()
        except Exception as exc:
            self._failed = True
            raise StorageIOError(f"sync of {self._path} failed: {exc}") from exc

    def drop_overwritten(self, family: str) -> None:
        """Flush every family's memtable (so no WAL file still holds a write of ``family``: RocksDB deletes a
        WAL once every family's data in it is in a table), then compact ``family`` whole (its tables are rewritten
        without the overwritten versions; no snapshot is held, so none is kept)."""
        self._live()
        try:
            for cf in self._cfs.values():
                cf.flush(True)
            # forced to the bottom: by default a lone table may be moved down a level as it is, old versions and all
            opts = rocksdict.CompactOptions()
            opts.set_bottommost_level_compaction(rocksdict.BottommostLevelCompaction.force())
            self._cfs[family].compact_range(None, None, opts)
        except KeyError:
            raise ValueError(f"no column family {family!r}") from None
        except Exception as exc:
            raise _error(self._path, exc, "compaction of") from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._failed and not self._read_only:
            # a clean close leaves nothing in memtables, so the next open replays no WAL (fast recovery)
            for cf in self._cfs.values():
                try:
                    cf.flush(True)
                except Exception as exc:
                    # nothing is lost: the WAL holds it and the next open replays it
                    log.warning("store.flush_failed path=%s error=%s", self._path, exc)
                    self._failed = True
                    break
        self._cfs = {}
        self._handles = {}
        if self._unopened is not None:
            return
        try:
            self._db.close()
        except Exception as exc:
            if not self._failed:
                raise StoreError(f"close of {self._path} failed: {exc}") from exc

    def verify(self) -> dict[str, int]:
        """Read every record of every column family with its checksum verified (a flipped byte in a table is
        found only so); the number of records in each. ``StoreCorruptionError`` names the first damage."""
        self._live()
        opts = rocksdict.ReadOptions()
        opts.set_verify_checksums(True)
        opts.fill_cache(False)  # type: ignore[call-arg]  # the stub lacks the flag; one pass: keep the cache
        counts: dict[str, int] = {}
        for name, cf in self._cfs.items():
            n = 0
            try:
                it = cf.iter(opts)
                it.seek_to_first()
                while it.valid():
                    n += 1
                    it.next()
                it.status()
            except Exception as exc:
                raise _error(self._path, exc, "read of") from exc
            counts[name] = n
        return counts

    def close_unflushed(self) -> None:
        """Close without flushing its memtables (a store about to be thrown away: nothing more is written)."""
        self._failed = True
        self.close()


def open_rocks_store(path: str | Path, **settings: Any) -> Store:
    """A ``Store`` over a RocksDB database at ``path`` (created if missing); ``settings`` as ``Store`` takes them,
    and ``tuning``: RocksDB's memory budget (a ``RocksTuning``; None: the built-in one).

    Kept here, not on ``Store``, so that importing ``edgehub.store`` never loads rocksdict (layer contract)."""
    tuning = settings.pop("tuning", None)
    if tuning is not None and not isinstance(tuning, RocksTuning):
        raise TypeError(f"tuning must be a RocksTuning, not {type(tuning).__name__}")
    return Store(RocksBackend(path, tuning=tuning), **settings)


def repair_db(path: str | Path) -> None:
    """RocksDB's repair (``RepairDB``) in place: a new MANIFEST from the table files it finds (WALs turned into
    tables, files it cannot read moved to ``lost/``). For a store whose MANIFEST or CURRENT is gone; it drops a
    whole table for one bad block, and WAL records of a column family no table names (``edgehub.store.salvage``
    copies record by record instead where the store still opens)."""
    try:
        rocksdict.Rdict.repair(str(path), _options())
    except Exception as exc:
        raise _error(str(path), exc, "repair of") from exc
