"""Checking and repairing a damaged RocksDB store: what ``edgehub store check`` and ``edgehub store repair`` run.

``check_store`` opens the store read-only (nothing is written: the damage stays as found), with the checks the
hub opens it with, and reads every record with its checksum verified.

``repair_store`` moves the damaged store aside (renamed: it stays whole, and needs no room) and builds a new
one in its place from what can still be read: the damaged store is opened as leniently as RocksDB allows
(``RocksBackend(salvage=True)``: WAL records past a damaged one replayed) and copied record by record, a
damaged block skipped by seeking past it. Where it cannot be opened at all (CURRENT or the MANIFEST gone),
RocksDB's repair (``repair_db``) first rebuilds a MANIFEST on a scratch copy. RocksDB's repair alone is not
the default because, measured on stores the hub wrote, it kept none of 2,000 records for one flipped byte in a
table (it moves the whole table to ``lost/``) and none of a WAL's records whose column family no table named.

Invariants: the damaged store is never changed (renamed only); the new store's LOCK is held from the moment
the old one is renamed, so a hub started meanwhile cannot begin an empty store there; on a failure the new
store is removed and the damaged one put back. ``exclusive`` holds a store's LOCK as RocksDB does, so both
refuse a store a running hub holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edgehub.core import StorageIOError, StoreCorruptionError, StoreError
from edgehub.store.backend import Op
from edgehub.store.rocks import WAL_MARK, RocksBackend, repair_db

__all__ = ["RepairReport", "check_store", "exclusive", "repair_store"]

log = logging.getLogger(__name__)

_BATCH = 1000  # records per write of the copy
_MAX_SKIPS = 10_000  # damaged spots skipped per column family before the copy of that family gives up
_KEY_SPACE = 1 << 64


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What a repair did: ``recovered`` records per column family in the new store, ``skipped`` the damaged
    spots passed over (each a column family and the keys around it), ``manifest_rebuilt`` when RocksDB's repair
    had to rebuild the MANIFEST, ``lost_files`` the files it could not read (moved to ``lost/`` of the copy),
    ``found`` what the check said before."""

    found: str
    recovered: dict[str, int]
    skipped: list[str] = field(default_factory=list)
    manifest_rebuilt: bool = False
    lost_files: list[str] = field(default_factory=list)


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold the store's LOCK file as RocksDB does (an fcntl lock): a hub cannot open the store meanwhile, and when
    a running hub holds it this raises ``StorageIOError`` saying so. Nothing to hold where there is no LOCK."""
    lock = Path(path) / "LOCK"
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        yield
        return
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise StorageIOError(
                f"the store at {path} is in use: a running hub holds its LOCK; stop the hub first"
            ) from exc
        yield
    finally:
        os.close(fd)


def _require_store(path: Path) -> None:
    if not path.is_dir() or not any(path.iterdir()):
        raise StoreError(f"there is no store at {path}")


def check_store(path: str | Path) -> dict[str, int]:
    """Every record read with its checksum verified, the store opened read-only with the hub's checks; the number
    of records in each column family. ``StoreCorruptionError`` names the damage; ``StoreError`` when there is no
    store at ``path``."""
    path = Path(path)
    _require_store(path)
    backend = RocksBackend(path, read_only=True)
    try:
        return backend.verify()
    finally:
        backend.close()


def repair_store(path: str | Path, aside: str | Path) -> RepairReport:
    """Move the store at ``path`` to ``aside`` and build a new one at ``path`` from what can be read of it (see the
    module docstring). ``StoreError`` when there is no store or no room; the store is then as it was."""
    path, aside = Path(path), Path(aside)
    _require_store(path)
    try:
        found = f"ok ({sum(check_store(path).values())} records)"
    except StoreCorruptionError as exc:
        found = str(exc)
    os.rename(path, aside)
    scratch = path.with_name(f"{path.name}.repairing")
    try:
        target = RocksBackend(path)  # holds the LOCK at path from here on
    except BaseException:
        os.rename(aside, path)
        raise
    try:
        try:
            source = RocksBackend(aside, salvage=True)
            rebuilt, lost = False, []
        except StoreError as exc:
            log.info("store.repair_rebuilds_manifest path=%s error=%s", aside, exc)
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.copytree(aside, scratch, ignore=shutil.ignore_patterns("LOCK"))
            (scratch / WAL_MARK).unlink(missing_ok=True)
            repair_db(scratch)
            lost = sorted(os.listdir(scratch / "lost")) if (scratch / "lost").is_dir() else []
            source, rebuilt = RocksBackend(scratch, salvage=True), True
        try:
            recovered, skipped = _copy(source, target)
        finally:
            source.close()
        target.sync_wal()
        target.close()
    except BaseException:
        target.close_unflushed()  # closes it; the half-built store is removed and the damaged one put back
        shutil.rmtree(path, ignore_errors=True)
        os.rename(aside, path)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lost = [f for f in lost if f.endswith(".sst")]  # repair archives every old WAL and MANIFEST there too
    return RepairReport(found, recovered, skipped, rebuilt, lost)


def _copy(source: RocksBackend, target: RocksBackend) -> tuple[dict[str, int], list[str]]:
    recovered: dict[str, int] = {}
    skipped: list[str] = []
    for family in source.families():
        target.ensure_family(family)
        n = 0
        for batch in _readable(source, family, skipped):
            ops: list[Op] = [(family, k, v) for k, v in batch]
            target.write(ops, sync=False)
            n += len(ops)
        recovered[family] = n
    return recovered, skipped


def _readable(source: RocksBackend, family: str, skipped: list[str]) -> Iterator[list[tuple[bytes, bytes]]]:
    """The records of ``family`` in key order, in batches, each damaged block passed over (noted in ``skipped``)."""
    start = b""
    last: bytes | None = None
    skips = 0
    size = _BATCH
    while True:
        try:
            batch = source.scan(family, start, size)
        except StoreCorruptionError:
            if size > 1:
                size = 1  # one record at a time up to the damage, so that none before it is lost
                continue
            size = _BATCH
            skips += 1
            resume = _first_readable_after(source, family, last)
            where = f"after key {last.hex()}" if last is not None else "at its start"
            if resume is None or skips > _MAX_SKIPS:
                skipped.append(f"{family}: everything {where} (unreadable to its end)")
                return
            skipped.append(f"{family}: records {where} up to key {resume.hex()}")
            start = resume
            continue
        if not batch:
            return
        yield batch
        last = batch[-1][0]
        start = last + b"\x00"  # the least key after it


def _first_readable_after(source: RocksBackend, family: str, last: bytes | None) -> bytes | None:
    """The least key (taking keys as 8-byte big-endian numbers, as the store's are) past ``last`` from which
    ``family`` reads again; None when nothing after it can be read. Doubling then bisection: a seek fails while
    the first key at or after it is in a damaged block, and succeeds from past that block."""
    base = int.from_bytes((last or b"")[:8].ljust(8, b"\x00"), "big")

    def readable(step: int) -> bool:
        try:
            source.scan(family, (base + step).to_bytes(8, "big"), 1)
        except StoreCorruptionError:
            return False
        return True

    step = 1
    while not readable(step):
        step *= 2
        if base + step >= _KEY_SPACE:
            if readable(_KEY_SPACE - 1 - base):
                step = _KEY_SPACE - 1 - base
                break
            return None
    low, high = step // 2, step  # low fails (or is 0, before the damage), high reads
    while high - low > 1:
        mid = (low + high) // 2
        if readable(mid):
            high = mid
        else:
            low = mid
    return (base + high).to_bytes(8, "big")
