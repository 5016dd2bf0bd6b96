"""RocksDB's memory budget, as the store is told it (a hardware profile sets it; ``edgehub.store.rocks`` applies it).

Where a RocksDB process's memory goes, and which field bounds it:
* memtables (writes not yet flushed to a table): at most ``db_write_buffer_bytes`` over every column family
  together (RocksDB's write buffer manager flushes the largest when the sum passes it); one column family's
  memtable is flushed at ``write_buffer_bytes``, and holds at most ``max_write_buffers`` of them (one being
  written, the others waiting for their flush);
* the block cache (table blocks read back: a backlog being delivered after an outage): ``block_cache_bytes``,
  one LRU cache shared by every column family (without it each column family's table factory gets its own
  default cache, so the total grew with the number of queues); index and filter blocks are charged to it too,
  so they cannot grow beside it with the number of table files;
* open table files, each with its reader's state: ``max_open_files`` (-1: no limit, RocksDB's default);
* background flush and compaction threads, each with its buffers: ``max_background_jobs``.

None leaves a setting at RocksDB's default; ``RocksTuning()`` is what the store used before profiles existed (only
the 32 MiB cap over all memtables), so a hub started without a profile behaves as it did.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["DEFAULT_DB_WRITE_BUFFER_BYTES", "RocksTuning"]

# All memtables together stay under this, whatever the number of queues (column families): a gateway has
# little memory, and the WAL already makes every write durable.
DEFAULT_DB_WRITE_BUFFER_BYTES = 32 << 20

_MIN_BUFFER_BYTES = 64 << 10  # below this RocksDB flushes tiny tables all the time
_MAX_BYTES = 16 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class RocksTuning:
    """RocksDB's memory settings; see the module docstring. Every bound is checked here (``ValueError``)."""

    db_write_buffer_bytes: int = DEFAULT_DB_WRITE_BUFFER_BYTES
    write_buffer_bytes: int | None = None
    max_write_buffers: int | None = None
    block_cache_bytes: int | None = None
    max_open_files: int | None = None
    max_background_jobs: int | None = None

    def __post_init__(self) -> None:
        for name in ("db_write_buffer_bytes", "write_buffer_bytes"):
            value = getattr(self, name)
            if value is not None and not _MIN_BUFFER_BYTES <= value <= _MAX_BYTES:
                raise ValueError(f"{name} must be within {_MIN_BUFFER_BYTES} and {_MAX_BYTES} bytes, not {value}")
        if self.write_buffer_bytes is not None and self.write_buffer_bytes > self.db_write_buffer_bytes:
            raise ValueError("write_buffer_bytes (one memtable) must not exceed db_write_buffer_bytes (all of them)")
        if self.block_cache_bytes is not None and not 0 <= self.block_cache_bytes <= _MAX_BYTES:
            raise ValueError(f"block_cache_bytes must be within 0 and {_MAX_BYTES}, not {self.block_cache_bytes}")
        if self.max_write_buffers is not None and not 2 <= self.max_write_buffers <= 16:
            raise ValueError(f"max_write_buffers must be within 2 and 16, not {self.max_write_buffers}")
        # fewer than 16 files would have RocksDB reopen tables on every read; -1 is RocksDB's "no limit"
        if self.max_open_files is not None and not (self.max_open_files == -1 or 16 <= self.max_open_files <= 1 << 20):
            raise ValueError(f"max_open_files must be -1 (no limit) or within 16 and {1 << 20}")
        if self.max_background_jobs is not None and not 1 <= self.max_background_jobs <= 64:
            raise ValueError(f"max_background_jobs must be within 1 and 64, not {self.max_background_jobs}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
