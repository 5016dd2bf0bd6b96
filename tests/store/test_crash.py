"""Crash safety: a real subprocess writing, committing, cleaning up, dead-lettering, requeueing and purging
under load is SIGKILLed (``tests.store.crash_writer``). The reopened store has every acknowledged message,
brings back nothing that was committed, removed or purged, and is consistent: no body without a reference,
no reference without a body, usage (per endpoint, per identity, store-wide) and removal counts that match what
is stored.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edgehub.core import Message, RouteResult
from edgehub.store import QueueId, RemovalReason, Store, dead_letter_name
from edgehub.store.codec import decode_dead_letter, decode_message, decode_ref, pack_u64, unpack_u64
from edgehub.store.rocks import RocksBackend
from edgehub.store.store import MESSAGES
from tests.store.figures import assert_open_figures_match_a_scan

ROOT = Path(__file__).resolve().parents[2]
UP = QueueId("up", 0)
MOD = QueueId("mod", 5)
DLQ = dead_letter_name("mod")


@dataclass
class Reported:
    """What the writer said had finished before it was killed."""

    acked: set[int] = field(default_factory=set)
    committed: int = -1
    removed: set[int] = field(default_factory=set)  # offsets on ``up``
    dead: set[int] = field(default_factory=set)
    requeued: int = 0
    purged: set[int] = field(default_factory=set)
    purging: list[int] = field(default_factory=list)  # a purge started and not reported finished

    def take(self, line: str) -> None:
        kind, *values = line.split()
        ns = [int(v) for v in values]
        if kind == "ack":
            self.acked.update(ns)
        elif kind == "commit":
            self.committed = max(self.committed, *ns)
        elif kind == "removed":
            self.removed.update(ns)
        elif kind == "dead":
            self.dead.update(ns)
        elif kind == "requeued":
            self.requeued += len(ns)
        elif kind == "purging":
            self.purging = ns
        elif kind == "purged":
            self.purged.update(ns)
            self.purging = []


async def run_and_kill(db: Path, enough: Callable[[Reported], bool]) -> Reported:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.store.crash_writer", str(db), cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    seen = Reported()
    try:
        async with asyncio.timeout(60):
            assert await proc.stdout.readline() == b"ready\n"
            while not enough(seen):
                seen.take((await proc.stdout.readline()).decode())
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    # lines written before the kill but not yet read report finished calls too (a torn last line cannot be
    # one: each line is written whole and flushed)
    for line in (await proc.stdout.read()).decode().splitlines():
        seen.take(line)
    assert proc.returncode == -signal.SIGKILL
    return seen


def rows(backend: RocksBackend, family: str) -> list[tuple[bytes, bytes]]:
    return backend.scan(family, pack_u64(0), 1 << 30)


def check_consistency(backend: RocksBackend) -> int:
    """No body without a live reference, no reference without its body. Returns the number of bodies."""
    bodies = {unpack_u64(k): decode_message(v) for k, v in rows(backend, MESSAGES)}
    live: dict[str, set[int]] = {}
    for family in (UP.name, MOD.name, DLQ):
        live[family] = {unpack_u64(k) for k, _ in rows(backend, family)}
    for family in (UP.name, MOD.name):
        for k, v in rows(backend, family):
            key = decode_ref(v).message_key
            assert key in bodies, f"reference {family}@{unpack_u64(k)} to missing body {key}"
    for k, v in rows(backend, DLQ):
        key = decode_dead_letter(v).message_key
        assert key in bodies, f"dead letter {unpack_u64(k)} of missing body {key}"
    for key, rec in bodies.items():
        assert any(off in live.get(fam, set()) for fam, off in rec.refs), f"body {key} has no reference left"
    return len(bodies)


def whole_run(seen: Reported) -> bool:
    return len(seen.acked) >= 2000 and bool(seen.removed and seen.dead and seen.requeued and seen.purged)


@pytest.mark.slow
@pytest.mark.parametrize(
    "enough",
    [lambda seen: len(seen.acked) >= 50, whole_run],
    ids=["early", "after-every-kind-of-write"],
)
async def test_sigkill_loses_no_acknowledged_write_and_resurrects_nothing_removed(
    tmp_path: Path, enough: Callable[[Reported], bool]
) -> None:
    db = tmp_path / "db"
    seen = await run_and_kill(db, enough)
    backend = RocksBackend(db)
    body_count = check_consistency(backend)
    store = Store(backend)
    try:
        on_mod = {int(it.message.body[1:]) for it in store.read(MOD, 0, 10**6)}
        dead = {int(d.message.body[1:]) for d in store.dead_letters("mod", 10**6)}
        assert not on_mod & dead  # a move to or from the dead-letter queue is one batch
        # nothing acknowledged is lost, except what was purged on purpose
        assert seen.acked - seen.purged - set(seen.purging) <= on_mod | dead
        # nothing purged comes back; a purge cut short by the kill happened whole or not at all
        assert not seen.purged & (on_mod | dead)
        cut = set(seen.purging)
        assert cut <= on_mod | dead or not cut & (on_mod | dead)
        # up: the checkpoint did not go back, delivered references do not reappear, removed ones stay gone
        assert store.checkpoint(UP).committed >= seen.committed
        assert all(it.offset > store.checkpoint(UP).committed for it in store.read(UP, 0, 10**6))
        up_refs = {r.offset for r in store.references(UP, 0, 10**6)}
        assert not up_refs & seen.removed
        # counters written with the changes they count
        assert store.usage("up")[0] == len(up_refs)
        assert store.usage("mod")[0] == len(on_mod)
        assert store.usage(None)[0] == body_count
        assert_open_figures_match_a_scan(store, backend)  # the bytes (charged sizes), and each identity's
        assert store.removed[RemovalReason.DELIVERED] == store.next_offset(UP) - len(up_refs)
        assert store.removed[RemovalReason.DEADLETTER] >= len(seen.dead)
        assert store.removed[RemovalReason.PURGED] >= len(seen.purged)
        # offsets keep growing after the crash
        before = store.next_offset(UP)
        receipt = await store.enqueue(Message(body=b"again"), [RouteResult("up", 0)])
        assert receipt.refs[0][1] == before
    finally:
        await store.close()
