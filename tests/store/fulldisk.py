"""A real small disk for full-disk tests: an 8 MB tmpfs (mounting needs root, which the test machines and CI
containers have), and ``fill`` to use up its space with a real file."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        # CI runs the suite as root, so there this test always runs; only a developer's unprivileged run skips.
        pytest.skip("needs root to mount an 8 MB tmpfs as the full disk (CI runs as root and runs this test)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)
