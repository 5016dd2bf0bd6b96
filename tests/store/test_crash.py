"""Crash safety: a real subprocess writing under load is SIGKILLed; the reopened store has every acknowledged
message and no committed checkpoint comes back."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from edgehub.core import Message, RouteResult
from edgehub.store import QueueId
from edgehub.store.rocks import open_rocks_store

ROOT = Path(__file__).resolve().parents[2]


async def run_and_kill(db: Path, acks_before_kill: int) -> tuple[set[int], int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.store.crash_writer", str(db), cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    acked: set[int] = set()
    committed = -1
    try:
        async with asyncio.timeout(60):
            assert await proc.stdout.readline() == b"ready\n"
            while len(acked) < acks_before_kill:
                kind, _, value = (await proc.stdout.readline()).decode().partition(" ")
                if kind == "ack":
                    acked.add(int(value))
                elif kind == "commit":
                    committed = max(committed, int(value))
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    # lines written before the kill but not yet read were acknowledged too
    for line in (await proc.stdout.read()).decode().splitlines():
        kind, _, value = line.partition(" ")
        if kind == "ack" and value:
            acked.add(int(value))
        elif kind == "commit" and value:
            committed = max(committed, int(value))
    assert proc.returncode == -signal.SIGKILL
    return acked, committed


@pytest.mark.slow
@pytest.mark.parametrize("acks_before_kill", [50, 2000])
async def test_sigkill_loses_no_acknowledged_write_and_resurrects_no_commit(
    tmp_path: Path, acks_before_kill: int
) -> None:
    db = tmp_path / "db"
    acked, committed = await run_and_kill(db, acks_before_kill)
    store = open_rocks_store(db)
    try:
        mod = store.read(QueueId("mod", 5), 0, 10**6)
        stored = {int(it.message.body[1:]) for it in mod}
        assert acked <= stored
        up = QueueId("up", 0)
        assert store.checkpoint(up).committed >= committed
        remaining = store.read(up, 0, 10**6)
        assert all(it.offset > committed for it in remaining)
        # every message that was not delivered on `up` is still there
        delivered = store.checkpoint(up).committed + 1
        assert len(remaining) == len(stored) - delivered
        # offsets keep growing after the crash
        before = store.next_offset(up)
        receipt = await store.enqueue(Message(body=b"again"), [RouteResult("up", 0)])
        assert receipt.refs[0][1] == before >= len(stored)
    finally:
        await store.close()
