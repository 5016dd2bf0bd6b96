"""Each identity's share of the store over both stores: a device past its share is refused at once while another
is accepted, and what each identity holds stays right across delivery, TTL removal, eviction, dead letters and a
reopen (so a share still holds after a restart)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgehub.core import Message, QuotaExceededError, RouteResult
from edgehub.store import MemoryBackend, Overflow, QueueId, QueuePolicy, RemovalReason, Store, StoreQuota
from edgehub.store.policy import disk_store_quota
from tests.store.conftest import StoreFactory

pytestmark = pytest.mark.timeout(30)

UP = QueueId("up", 0)
UP_ROUTE = [RouteResult("up", 0)]
BOTH_ROUTES = [RouteResult("up", 0), RouteResult("side", 0)]


def msg(device: str, size: int = 500, module: str | None = None) -> Message:
    """A message of exactly ``size`` charged bytes from ``device`` (or its ``module``)."""
    sp = {"connectionDeviceId": device}
    if module is not None:
        sp["connectionModuleId"] = module
    overhead = Message(b"", {}, sp).size_bytes()
    return Message(b"x" * (size - overhead), {}, sp)


def quota(share: float = 0.25, max_bytes: int = 10_000) -> StoreQuota:
    return StoreQuota(max_bytes=max_bytes, identity_share=share)


async def test_a_device_past_its_share_is_refused_while_another_is_accepted(store_factory: StoreFactory) -> None:
    s = store_factory(store_quota=quota(), default_policy=QueuePolicy(enqueue_timeout_s=0))
    try:
        # 2,500 bytes each: five messages of 500 fit, the sixth would not (a group that fits goes in one write).
        first = await s.enqueue_many([(msg("devA"), UP_ROUTE) for _ in range(4)])
        assert not any(isinstance(r, QuotaExceededError) for r in first)
        results = await s.enqueue_many([(msg("devA"), UP_ROUTE) for _ in range(3)])
        assert [type(r).__name__ for r in results] == ["EnqueueReceipt", "QuotaExceededError", "QuotaExceededError"]
        assert "identity devA holds 2500 bytes" in str(results[1])
        assert s.identity_usage("devA") == (5, 2500)
        other = await s.enqueue_many([(msg("devB"), UP_ROUTE), (msg("devA", module="filter"), UP_ROUTE)])
        assert not any(isinstance(r, QuotaExceededError) for r in other)
        with pytest.raises(QuotaExceededError):
            await s.enqueue(msg("devA", size=10), UP_ROUTE)  # one at a time (the duplicate window's path) too
        assert s.identity_usage("devB") == (1, 500)
        assert s.identity_usage("devA/filter") == (1, 500)
        assert s.usage(None) == (7, 3500)
    finally:
        await s.close()


async def test_identity_usage_follows_delivery_ttl_dead_letters_and_a_reopen(store_factory: StoreFactory) -> None:
    s = store_factory(store_quota=quota(share=0.5))
    try:
        await s.enqueue_many([(msg("devA"), UP_ROUTE) for _ in range(4)])  # offsets 0..3 of up
        await s.enqueue_many([(msg("devA"), BOTH_ROUTES)])  # offset 4 of up, 0 of side: one body
        assert s.identity_usage("devA") == (5, 2500)
        await s.commit(UP, 1)  # delivered, held in memory, sole references: removed with the commit
        assert s.identity_usage("devA") == (3, 1500)
        await s.remove(UP, [2], RemovalReason.TTL)  # read back from the database
        assert s.identity_usage("devA") == (2, 1000)
        [item] = s.read(UP, 3, 1)
        await s.dead_letter(item, reason="test", attempts=1)  # still held, in the dead-letter queue
        assert s.identity_usage("devA") == (2, 1000)
        await s.purge_dead_letters("up")
        assert s.identity_usage("devA") == (1, 500)
        await s.commit(UP, 4)
        await s.remove_delivered(UP)  # offset 4's body is still side's
        assert s.identity_usage("devA") == (1, 500)
    finally:
        await s.close()
    s = store_factory(store_quota=quota(share=0.5))
    try:
        assert s.identity_usage("devA") == (1, 500)
        await s.remove(QueueId("side", 0), [0], RemovalReason.TTL)
        assert s.identity_usage("devA") == (0, 0)
        assert s.usage(None) == (0, 0)
    finally:
        await s.close()


async def test_one_commit_of_several_senders_messages_uncounts_each_sender(store_factory: StoreFactory) -> None:
    s = store_factory(store_quota=quota())
    try:
        await s.enqueue_many([(msg("devA"), UP_ROUTE), (msg("devB"), UP_ROUTE), (msg("devA"), UP_ROUTE)])
        await s.enqueue_many([(msg("devC", 300), UP_ROUTE)], sender="devC")  # the hub names the sender
        assert [s.identity_usage(d) for d in ("devA", "devB", "devC")] == [(2, 1000), (1, 500), (1, 300)]
        await s.commit(UP, 3)
        assert [s.identity_usage(d) for d in ("devA", "devB", "devC")] == [(0, 0)] * 3
    finally:
        await s.close()


async def test_a_share_still_holds_after_a_reopen(store_factory: StoreFactory) -> None:
    s = store_factory(store_quota=quota(), default_policy=QueuePolicy(enqueue_timeout_s=0))
    try:
        await s.enqueue_many([(msg("devA"), UP_ROUTE) for _ in range(5)])
    finally:
        await s.close()
    s = store_factory(store_quota=quota(), default_policy=QueuePolicy(enqueue_timeout_s=0))
    try:
        [refused, taken] = await s.enqueue_many([(msg("devA"), UP_ROUTE), (msg("devB"), UP_ROUTE)])
        assert isinstance(refused, QuotaExceededError)
        assert not isinstance(taken, QuotaExceededError)
    finally:
        await s.close()


async def test_a_store_written_before_identities_were_counted_is_counted_when_opened() -> None:
    memory = MemoryBackend()
    s = Store(memory)
    await s.enqueue_many([(msg("devA"), UP_ROUTE) for _ in range(3)] + [(msg("devB"), BOTH_ROUTES)])
    await s.close()
    # What an older build left: no identity counters, no marker.
    memory = memory.reopened()
    old = [k for k, _ in memory.scan("meta", b"stats/", 1000) if b"\x00" in k or k == b"stats/identities-counted"]
    assert old
    memory.write([("meta", k, None) for k in old], sync=True)
    s = Store(memory)
    try:
        assert s.identity_usage("devA") == (3, 1500)
        assert s.identity_usage("devB") == (1, 500)
        await s.remove(QueueId("side", 0), [0], RemovalReason.TTL)
        await s.remove(UP, [3], RemovalReason.TTL)
        assert s.identity_usage("devB") == (0, 0)
    finally:
        await s.close()
    s = Store(memory.reopened())  # counted once: a later open loads the counters, it does not count again
    try:
        assert s.identity_usage("devA") == (3, 1500)
        assert s.identity_usage("devB") == (0, 0)
    finally:
        await s.close()


async def test_eviction_for_the_store_quota_gives_the_evicted_identity_its_room_back(
    store_factory: StoreFactory,
) -> None:
    s = store_factory(
        store_quota=quota(share=1.0, max_bytes=2000),
        default_policy=QueuePolicy(enqueue_timeout_s=0, overflow=Overflow.DISCARD_OLDEST),
    )
    try:
        await s.enqueue_many([(msg("devA"), UP_ROUTE) for _ in range(4)])
        await s.enqueue_many([(msg("devB"), UP_ROUTE)])  # the store is full: devA's oldest goes
        assert s.identity_usage("devA") == (3, 1500)
        assert s.identity_usage("devB") == (1, 500)
        assert s.removed[RemovalReason.OVERFLOW] == 1
    finally:
        await s.close()


def test_a_share_needs_a_store_quota_and_is_a_fraction() -> None:
    assert StoreQuota(identity_share=0.25).identity_max_bytes is None
    assert StoreQuota(max_bytes=1000, identity_share=0.25).identity_max_bytes == 250
    with pytest.raises(ValueError, match="identity_share"):
        StoreQuota(max_bytes=1000, identity_share=1.5)


async def test_messages_from_no_identity_are_not_bound_by_a_share() -> None:
    s = Store.in_memory(store_quota=quota(share=0.01))
    try:
        results = await s.enqueue_many([(Message(b"x" * 400), UP_ROUTE) for _ in range(5)])
        assert not any(isinstance(r, QuotaExceededError) for r in results)
    finally:
        await s.close()


def test_disk_store_quota_is_what_the_store_holds_plus_half_the_free_space_capped(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    got = disk_store_quota(tmp_path, 1000, cap_bytes=1 << 62)
    assert abs(got - (1000 + free // 2)) <= 1 << 20  # the disk may move a little between the two looks
    assert disk_store_quota(tmp_path, 1000, cap_bytes=5000) == 5000


async def test_a_group_is_counted_per_endpoint_and_per_sender_whether_routed_alike_or_not(
    store_factory: StoreFactory,
) -> None:
    # The usage of a group is counted once for the group: check it against the sums message by message, for a
    # group routed alike (one step) and for one whose messages go to different endpoints (one per message).
    s = store_factory()
    try:
        await s.enqueue_many([(msg("devA"), BOTH_ROUTES) for _ in range(3)], sender="devA")
        assert (s.usage("up"), s.usage("side"), s.usage(None)) == ((3, 1500), (3, 1500), (3, 1500))
        assert s.identity_usage("devA") == (3, 1500)
        mixed = [(msg("devB", 300), UP_ROUTE), (msg("devC", 200), BOTH_ROUTES), (msg("devB", 100), [])]
        await s.enqueue_many(mixed)  # no sender named: each message's own (its connectionDeviceId)
        assert (s.usage("up"), s.usage("side"), s.usage(None)) == ((5, 2000), (4, 1700), (5, 2000))
        assert (s.identity_usage("devB"), s.identity_usage("devC")) == ((1, 300), (1, 200))  # routed nowhere: 0
    finally:
        await s.close()
    s = store_factory()  # the counts were written with the groups
    try:
        assert (s.usage("up"), s.usage("side"), s.usage(None)) == ((5, 2000), (4, 1700), (5, 2000))
        assert (s.identity_usage("devA"), s.identity_usage("devB")) == ((3, 1500), (1, 300))
    finally:
        await s.close()


async def test_a_commit_uncounts_each_sender_when_their_groups_interleave_in_a_queue(
    store_factory: StoreFactory,
) -> None:
    s = store_factory()
    try:
        for sender, size in [("devA", 500), ("devB", 300), ("devA", 400), ("devB", 200)]:
            await s.enqueue_many([(msg(sender, size), UP_ROUTE) for _ in range(2)], sender=sender)
        assert (s.identity_usage("devA"), s.identity_usage("devB")) == ((4, 1800), (4, 1000))
        await s.commit(UP, 5)  # delivered and held in memory: removed with the commit, runs A, B, A
        assert (s.identity_usage("devA"), s.identity_usage("devB")) == ((0, 0), (2, 400))
        assert s.usage("up") == (2, 400)
    finally:
        await s.close()
