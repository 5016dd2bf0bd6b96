"""A subprocess for the crash tests: writes under load and reports each finished call on stdout.

Usage: python -m tests.store.crash_writer DB_PATH

Eight producers enqueue messages ``w<n>`` to ``up`` (priority 0) and ``mod`` (priority 5). A consumer commits
``up`` every few messages and then removes what it committed (cleanup, reason delivered). A handler on ``mod``
dead-letters every message whose ``n`` is a multiple of 3, and every few rounds requeues some dead letters and
purges others. Each line is flushed only after the call it reports returned, except ``purging``, which is
flushed before its call:

``ack <n>`` (enqueue of ``w<n>``), ``commit <offset>``, ``removed <offset>...`` (from ``up``), ``dead <n>``,
``requeued <n>...``, ``purging <n>...`` then ``purged <n>...``.

The test SIGKILLs it at any moment.
"""

from __future__ import annotations

import asyncio
import sys

from edgehub.core import Message, RouteResult
from edgehub.store import QueueId, RemovalReason, Store
from edgehub.store.rocks import open_rocks_store

UP = QueueId("up", 0)
MOD = QueueId("mod", 5)


def number(message: Message) -> int:
    return int(message.body[1:])


def say(*words: object) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


async def produce(store: Store, counter: list[int]) -> None:
    while True:
        n = counter[0]
        counter[0] += 1
        # from three devices, so that the identities' counters are written (and checked after the kill) too
        message = Message(body=f"w{n}".encode(), system_properties={"connectionDeviceId": f"dev{n % 3}"})
        await store.enqueue(message, [RouteResult("up", 0), RouteResult("mod", 5)])
        say("ack", n)


async def consume_up(store: Store) -> None:
    while True:
        items = store.read(UP, 0, 7)
        if items:
            last = items[-1].offset
            await store.commit(UP, last)
            say("commit", last)
            delivered = [r.offset for r in store.references(UP, 0, 64) if r.offset <= last]
            if await store.remove(UP, delivered, RemovalReason.DELIVERED):
                say("removed", *delivered)
        await asyncio.sleep(0.001)


async def handle_mod(store: Store) -> None:
    cursor = 0
    rounds = 0
    while True:
        rounds += 1
        for item in store.read(MOD, cursor, 5):
            cursor = item.offset + 1
            if number(item.message) % 3 == 0 and await store.dead_letter(item, reason="invalid", attempts=1) >= 0:
                say("dead", number(item.message))
        if rounds % 4 == 0:
            letters = store.dead_letters("mod", 6)
            back, gone = letters[: len(letters) // 2], letters[len(letters) // 2 :]
            if back and await store.requeue_dead_letters("mod", [d.dlq_offset for d in back]):
                say("requeued", *(number(d.message) for d in back))
            if gone:
                ns = [number(d.message) for d in gone]
                say("purging", *ns)
                await store.purge_dead_letters("mod", [d.dlq_offset for d in gone])
                say("purged", *ns)
        await asyncio.sleep(0.001)


async def main(path: str) -> None:
    store = open_rocks_store(path)
    counter = [0]
    say("ready")
    async with asyncio.TaskGroup() as tg:
        for _ in range(8):
            tg.create_task(produce(store, counter))
        tg.create_task(consume_up(store))
        tg.create_task(handle_mod(store))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
