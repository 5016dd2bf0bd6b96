"""Test helpers that act on a checkpoint folder as a crash, or another Spark, would leave it.

Tests use them to put a real checkpoint, written by the real Spark, into the state they need: batches Spark has
planned or committed forgotten (a crash before the write), or a file rewritten in another layout.
"""

from __future__ import annotations

from pathlib import Path

from spark_upload.settings import JobSettings


def job_settings(tmp_path: Path, **kw: object) -> JobSettings:
    """Settings over ``tmp_path``'s landing, lake and checkpoint folders, metrics not printed."""
    return JobSettings(
        landing=str(tmp_path / "landing"),
        lake=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"),
        print_metrics=False,
        **kw,  # type: ignore[arg-type]
    )


def forget_batches(checkpoint: Path, *, commits_from: int, offsets_from: int) -> None:
    """Remove the commit log entries from batch ``commits_from`` and the offsets from ``offsets_from`` on (with
    their checksums), as a crash before Spark wrote them leaves the checkpoint."""
    for log, first_dropped in (("commits", commits_from), ("offsets", offsets_from)):
        for entry in (checkpoint / log).iterdir():
            if int(entry.name.strip(".").removesuffix(".crc")) >= first_dropped:
                entry.unlink()


def newest(log: Path) -> Path:
    """The newest entry of a checkpoint log folder (offsets, commits)."""
    return max((p for p in log.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def rewrite(path: Path, text: str) -> None:
    """Replace a checkpoint file, and drop the checksum Hadoop's local file system keeps beside it."""
    path.write_text(text)
    path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
