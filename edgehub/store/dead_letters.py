"""Dead letters: each endpoint's dead-letter queue (column family ``dlq:<endpoint>``, u64 DLQ offset -> record),
moving a reference there, listing, purging and requeueing.

Invariants:
* a dead letter keeps its message's body alive: the body lists the dead letter among its references, so the
  body goes only with its last reference, dead letters included;
* moving to the dead-letter queue is one atomic write (the reference out, the dead letter in, the body's
  reference list updated), counted as a ``DEADLETTER`` removal;
* a requeued dead letter gets a fresh offset at the tail of its queue, enqueued now with its original TTL; it
  becomes readable (``end_offset``) once its write finished, like any other reference;
* every write goes through ``Maintenance`` under its lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from edgehub.core import Clock, Message
from edgehub.core.logtext import shown
from edgehub.core.refusals import RateLimitedLog
from edgehub.store.backend import Backend, Op
from edgehub.store.codec import (
    VERSION,
    DeadLetterRecord,
    RefRecord,
    decode_dead_letter,
    decode_message,
    encode_dead_letter,
    encode_message,
    encode_ref,
    pack_u64,
    unpack_u64,
)
from edgehub.store.held import HeldCache
from edgehub.store.maintenance import Maintenance
from edgehub.store.queue_state import QueueState
from edgehub.store.queues import QueueId, dead_letter_name
from edgehub.store.records import MESSAGES, DeadLetter, RemovalReason, StoredItem
from edgehub.store.usage import Usage, add

__all__ = ["DeadLetters"]

log = logging.getLogger(__name__)


class DeadLetters:
    def __init__(
        self,
        backend: Backend,
        maintenance: Maintenance,
        held: HeldCache,
        clock: Clock,
        queues: Mapping[QueueId, QueueState],
        open_queue: Callable[[QueueId], QueueState],
    ) -> None:
        self._b = backend
        self._maint = maintenance
        self._held = held
        self._clock = clock
        # Senders of poison messages decide how many: a queue's lines are bounded; the count and the records are not.
        self._events = RateLimitedLog(log, clock=clock)
        self._queues = queues
        self._open_queue = open_queue
        self._next: dict[str, int] = {}  # endpoint -> its next DLQ offset, once looked up

    def _offset(self, endpoint: str) -> int:
        if endpoint not in self._next:
            last = self._b.last_key(dead_letter_name(endpoint))
            self._next[endpoint] = 0 if last is None else unpack_u64(last) + 1
        off = self._next[endpoint]
        self._next[endpoint] = off + 1
        return off

    async def move(self, item: StoredItem, *, reason: str, attempts: int, error: str | None) -> int:
        """Move ``item`` from its queue to its endpoint's dead-letter queue; the DLQ offset (-1: already gone)."""
        fam = dead_letter_name(item.queue.endpoint)
        self._b.ensure_family(fam)
        state = self._queues.get(item.queue)
        if state is not None:
            self._held.forget(state, (item.offset,))
        async with self._maint.lock:
            dlq_off = self._offset(item.queue.endpoint)
            raw = self._b.get(MESSAGES, pack_u64(item.message_key))
            if raw is None or self._b.get(item.queue.name, pack_u64(item.offset)) is None:
                return -1  # already removed (cleanup got there first)
            rec = decode_message(raw)
            refs = [*rec.refs, (fam, dlq_off)]
            dl = DeadLetterRecord(
                VERSION,
                item.queue.name,
                item.offset,
                item.message_key,
                item.enqueued_at_s,
                item.ttl_s,
                item.size_bytes,
                reason,
                attempts,
                error,
                self._clock.time(),
            )
            ops: list[Op] = [
                (item.queue.name, pack_u64(item.offset), None),
                (MESSAGES, pack_u64(item.message_key), encode_message(rec.to_message(), refs)),
                (fam, pack_u64(dlq_off), encode_dead_letter(dl)),
            ]
            deltas = {item.queue.endpoint: (-1, -item.size_bytes)}
            await self._maint.write(ops, deltas, (RemovalReason.DEADLETTER, 1))
        self._events.line(
            item.queue.name,
            "store.dead_lettered",
            queue=item.queue,
            offset=item.offset,
            reason=reason,
            attempts=attempts,
            error=shown(error or "", 200),
        )
        return dlq_off

    def letters(self, endpoint: str, limit: int) -> list[DeadLetter]:
        """The endpoint's dead letters, oldest first."""
        out: list[DeadLetter] = []
        for k, v in self._b.scan(dead_letter_name(endpoint), pack_u64(0), limit):
            dl = decode_dead_letter(v)
            body = self._b.get(MESSAGES, pack_u64(dl.message_key))
            if body is None:
                continue
            out.append(
                DeadLetter(
                    endpoint,
                    unpack_u64(k),
                    QueueId.parse(dl.queue),
                    dl.offset,
                    decode_message(body).to_message(),
                    dl.reason,
                    dl.attempts,
                    dl.error,
                    dl.dead_at_s,
                    dl.enqueued_at_s,
                    dl.ttl_s,
                )
            )
        return out

    def _chosen(self, endpoint: str, dlq_offsets: Sequence[int] | None) -> list[tuple[int, DeadLetterRecord]]:
        rows = self._b.scan(dead_letter_name(endpoint), pack_u64(0), 1 << 30)
        chosen = [(unpack_u64(k), decode_dead_letter(v)) for k, v in rows]
        if dlq_offsets is not None:
            wanted = set(dlq_offsets)
            chosen = [(o, d) for o, d in chosen if o in wanted]
        return chosen

    async def purge(self, endpoint: str, dlq_offsets: Sequence[int] | None) -> int:
        """Delete these dead letters (all when None), with each body whose last reference they were."""
        fam = dead_letter_name(endpoint)
        async with self._maint.lock:
            chosen = self._chosen(endpoint, dlq_offsets)
            if not chosen:
                return 0
            deltas: Usage = {}
            ops = self._maint.removal_ops([(fam, o, d.message_key, d.size_bytes) for o, d in chosen], deltas)
            await self._maint.write(ops, deltas, (RemovalReason.PURGED, len(chosen)))
        log.info("store.dead_letters_purged endpoint=%s count=%d", endpoint, len(chosen))
        return len(chosen)

    async def requeue(self, endpoint: str, dlq_offsets: Sequence[int] | None) -> int:
        """Put dead letters back at the tail of their queue, enqueued now with their original TTL."""
        fam = dead_letter_name(endpoint)
        now = self._clock.time()
        async with self._maint.lock:
            chosen = self._chosen(endpoint, dlq_offsets)
            ops: list[Op] = []
            placed: dict[QueueState, list[int]] = {}
            deltas: Usage = {}
            bodies: dict[int, tuple[Message, list[tuple[str, int]]]] = {}
            for dlq_off, d in chosen:
                state = self._open_queue(QueueId.parse(d.queue))
                if d.message_key not in bodies:
                    raw = self._b.get(MESSAGES, pack_u64(d.message_key))
                    if raw is None:
                        continue
                    rec = decode_message(raw)
                    bodies[d.message_key] = (rec.to_message(), list(rec.refs))
                off = state.hand_out()
                placed.setdefault(state, []).append(off)
                bodies[d.message_key][1].append((state.name, off))
                ref = RefRecord(VERSION, d.message_key, now, d.ttl_s, d.size_bytes)
                ops.append((state.name, pack_u64(off), encode_ref(ref)))
                ops.append((fam, pack_u64(dlq_off), None))
                add(deltas, state.id.endpoint, 1, d.size_bytes)
            for key, (msg, refs) in bodies.items():
                ops.append((MESSAGES, pack_u64(key), encode_message(msg, refs)))
            try:
                if ops:
                    await self._maint.write(ops, deltas)
            finally:
                for state, offsets in placed.items():
                    state.settle(offsets)
        return sum(len(offsets) for offsets in placed.values())
