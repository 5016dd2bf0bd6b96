"""The data directory is private (issue 34, item 5): a real one in tmp_path, written by ``edgehub identity``
(click's runner, in process, so the command's umask is the one at work) and by RocksDB under it."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgehub.runtime.cli import main
from edgehub.runtime.compose.store import store_path


def edgehub(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def wider_than_private(data: Path) -> list[str]:
    """Every entry under ``data`` (itself included) that a group or other may use, with its mode."""
    found = []
    for path in [data, *data.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077 and not path.is_symlink():
            found.append(f"{path.relative_to(data.parent)} {mode:o}")
    return found


def test_identity_add_leaves_the_data_dir_0700_and_every_file_in_it_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    edgehub("identity", "add", "dev1", "--data-dir", str(data))
    edgehub("identity", "add", "dev2", "--data-dir", str(data))
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert any(p.suffix == ".sst" for p in store_path(data).iterdir())  # RocksDB's own tables are among them
    assert wider_than_private(data) == []


def test_the_command_gives_the_umask_back_when_it_ends(tmp_path: Path) -> None:
    before = os.umask(0o022)
    try:
        edgehub("identity", "list", "--data-dir", str(tmp_path / "data"))
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(before)


def test_a_data_dir_found_wider_is_tightened_at_start_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    edgehub("identity", "add", "dev1", "--data-dir", str(data))
    os.chmod(data, 0o755)
    os.chmod(store_path(data), 0o755)
    for table in store_path(data).glob("*.sst"):
        os.chmod(table, 0o644)
    caplog.set_level(logging.INFO)
    edgehub("identity", "list", "--data-dir", str(data))
    assert wider_than_private(data) == []
    lines = [r.getMessage() for r in caplog.records if "runtime.data_dir_tightened" in r.getMessage()]
    assert len(lines) == 1
    assert "widest_was=755" in lines[0]
