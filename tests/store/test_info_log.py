"""RocksDB's info log stays bounded on disk: a store opened again and again keeps at most ``INFO_LOGS_KEPT`` log
files (RocksDB's default keeps 1,000 and never rolls the current one), each rolled at ``INFO_LOG_MAX_BYTES``."""

from __future__ import annotations

from pathlib import Path

from edgehub.store.rocks import INFO_LOGS_KEPT, open_rocks_store


async def test_reopening_a_store_many_times_keeps_a_bounded_number_of_info_logs(tmp_path: Path) -> None:
    path = tmp_path / "db"
    for _ in range(INFO_LOGS_KEPT + 4):
        store = open_rocks_store(path)
        await store.close()
    logs = sorted(p.name for p in path.iterdir() if p.name == "LOG" or p.name.startswith("LOG.old"))
    assert "LOG" in logs
    assert len(logs) <= INFO_LOGS_KEPT, logs
