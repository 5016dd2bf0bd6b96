"""The data directory is private: the directory and every directory in it 0700, every file 0600.

It holds the store (messages, twins, identities), the admin token, the hub's certificate keys and the key that
seals identity keys (``edgehub.runtime.keyseal``): nothing in it is for other local users, whose reading
it would give them the devices' keys and the admin API.

Two parts keep it so:
* ``private_umask``: the ``edgehub`` command runs with umask 077, so whatever it creates in the data directory
  (RocksDB's tables, logs and WAL files included, which RocksDB creates itself with no mode we choose) is private
  from its first byte. It is the command's, not the library's: a process umask is global, and a program that
  embeds the hub (a test, a benchmark) keeps its own.
* ``tighten_data_dir``: at start (``run_hub``, ``open_store``), what is found wider (a directory made by an older
  hub, a copied backup) is narrowed, with one log line that says how much.

Invariant: modes are only ever narrowed (the owner's bits stay), and a symbolic link is neither followed nor
changed: a link in the data directory pointing elsewhere is the operator's choice.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = ["PRIVATE_UMASK", "private_umask", "tighten_data_dir"]

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077


def private_umask() -> int:
    """Set the process umask to 077; returns the one it replaces."""
    return os.umask(PRIVATE_UMASK)


def tighten_data_dir(data_dir: Path) -> int:
    """Make ``data_dir`` (created if missing) 0700 and take every group and other bit off what is in it; the
    number of entries narrowed (logged once when any were)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    narrowed, widest = _narrow(str(data_dir), 0, 0)
    for root, dirs, files in os.walk(data_dir):
        for name in (*dirs, *files):
            narrowed, widest = _narrow(os.path.join(root, name), narrowed, widest)
    if narrowed:
        log.warning(
            "runtime.data_dir_tightened path=%s entries=%d widest_was=%o now=dirs_700_files_600",
            data_dir,
            narrowed,
            widest,
        )
    return narrowed


def _narrow(path: str, narrowed: int, widest: int) -> tuple[int, int]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:  # gone since the walk listed it (a RocksDB file deleted by a compaction)
        return narrowed, widest
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode) or not mode & 0o077:
        return narrowed, widest
    try:
        os.chmod(path, mode & ~0o077)
    except FileNotFoundError:
        return narrowed, widest
    return narrowed + 1, widest | mode
