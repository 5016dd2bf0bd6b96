"""A subprocess for the crash tests: writes under load and reports each acknowledged write on stdout.

Usage: python -m tests.store.crash_writer DB_PATH

Eight producers enqueue messages ``w<n>`` to ``up`` (priority 0) and ``mod`` (priority 5); a consumer commits
``up`` every few messages. Each line printed is flushed only after the call it reports returned:
``ack <n>`` after ``enqueue`` of ``w<n>``; ``commit <offset>`` after ``commit``. The test SIGKILLs it.
"""

from __future__ import annotations

import asyncio
import sys

from edgehub.core import Message, RouteResult
from edgehub.store import QueueId
from edgehub.store.rocks import open_rocks_store


async def main(path: str) -> None:
    store = open_rocks_store(path)
    counter = iter(range(10**9))
    out = sys.stdout

    async def producer() -> None:
        while True:
            n = next(counter)
            await store.enqueue(Message(body=f"w{n}".encode()), [RouteResult("up", 0), RouteResult("mod", 5)])
            out.write(f"ack {n}\n")
            out.flush()

    async def committer() -> None:
        q = QueueId("up", 0)
        while True:
            items = store.read(q, 0, 7)
            if items:
                await store.commit(q, items[-1].offset)
                out.write(f"commit {items[-1].offset}\n")
                out.flush()
            await asyncio.sleep(0.001)

    out.write("ready\n")
    out.flush()
    async with asyncio.TaskGroup() as tg:
        for _ in range(8):
            tg.create_task(producer())
        tg.create_task(committer())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
