"""A store on a full disk: the write that hits ENOSPC fails its group only, and the store stays usable.

The disk is a real 8 MB tmpfs filled with a real file; mounting needs root (CAP_SYS_ADMIN), which the test
machines and CI containers have.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgehub.core import Message, RouteResult, StorageIOError
from edgehub.store import QueueId
from edgehub.store.rocks import open_rocks_store


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
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


async def test_write_on_full_disk_fails_that_group_and_store_recovers(small_disk: Path) -> None:
    store = open_rocks_store(small_disk / "db")
    q = QueueId("up", 0)
    try:
        await store.enqueue(Message(body=b"before"), [RouteResult("up", 0)])
        fill(small_disk / "filler")
        with pytest.raises(StorageIOError, match="No space left"):
            await store.enqueue(Message(body=b"x" * 100_000), [RouteResult("up", 0)])
        (small_disk / "filler").unlink()
        await store.enqueue(Message(body=b"after"), [RouteResult("up", 0)])
        assert [it.message.body for it in store.read(q, 0, 10)] == [b"before", b"after"]
    finally:
        await store.close()
    reopened = open_rocks_store(small_disk / "db")
    try:
        assert [it.message.body for it in reopened.read(q, 0, 10)] == [b"before", b"after"]
    finally:
        await reopened.close()
