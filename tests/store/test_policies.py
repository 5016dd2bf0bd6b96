"""Queue policies over both stores: message size, quotas per endpoint and store-wide, each overflow policy,
the enqueue timeout (on a manual clock), and usage that survives a reopen."""

from __future__ import annotations

import asyncio

import pytest

from edgehub.core import Message, MessageTooLargeError, QuotaExceededError, RouteResult
from edgehub.store import Overflow, QueueId, QueuePolicy, RemovalReason, Store, StoreQuota
from edgehub.testing import ManualClock
from tests.store.conftest import StoreFactory

Q = QueueId("up", 0)


def m(i: int, size: int = 10) -> Message:
    return Message(body=str(i).encode().ljust(size, b"."))


def policy(**kw: object) -> QueuePolicy:
    return QueuePolicy(enqueue_timeout_s=0, **kw)  # type: ignore[arg-type]


async def test_message_over_max_size_is_refused(store_factory: StoreFactory) -> None:
    s = store_factory(default_policy=policy(max_message_size_bytes=100))
    try:
        with pytest.raises(MessageTooLargeError):
            await s.enqueue(m(1, 101), [RouteResult("up", 0)])
        await s.enqueue(m(2, 100), [RouteResult("up", 0)])
        assert s.usage("up") == (1, 100)
    finally:
        await s.close()


async def test_max_message_size_counts_properties_not_only_the_body(store_factory: StoreFactory) -> None:
    s = store_factory(default_policy=policy(max_message_size_bytes=100))
    try:
        # 60 (body) + 4 + 30 (property) + 18 + 4 (connectionDeviceId=dev1) = 116: the body alone would fit
        too_big = Message(
            body=b"b" * 60, properties={"kind": "p" * 30}, system_properties={"connectionDeviceId": "dev1"}
        )
        assert too_big.size_bytes() == 116
        with pytest.raises(MessageTooLargeError, match="116 bytes"):
            await s.enqueue(too_big, [RouteResult("up", 0)])
        fits = Message(body=b"b" * 60, properties={"kind": "p" * 14}, system_properties={"connectionDeviceId": "dev1"})
        await s.enqueue(fits, [RouteResult("up", 0)])
        assert s.usage("up") == (1, 100)  # the hub's own stamps are not charged
    finally:
        await s.close()


async def test_the_largest_message_size_is_the_most_any_endpoint_takes_as_the_policies_are_now(
    store_factory: StoreFactory,
) -> None:
    s = store_factory(default_policy=policy(max_message_size_bytes=100), endpoint_policies={})
    try:
        assert s.largest_message_size_bytes() == 100  # the hub's default alone
        s.endpoint_policies["big"] = policy(max_message_size_bytes=300)
        s.endpoint_policies["small"] = policy(max_message_size_bytes=50)
        assert s.largest_message_size_bytes() == 300
        # What the heads read up to is what the store takes on the endpoint that takes the most...
        await s.enqueue(m(1, 300), [RouteResult("big", 0)])
        with pytest.raises(MessageTooLargeError):  # ...while a message routed to a stricter one is refused here
            await s.enqueue(m(2, 300), [RouteResult("big", 0), RouteResult("up", 0)])
        s.default_policy = policy(max_message_size_bytes=500)  # live: a deployment raised the hub's limit
        assert s.largest_message_size_bytes() == 500
        del s.endpoint_policies["big"]
        s.default_policy = policy(max_message_size_bytes=80)  # and lowered it
        assert s.largest_message_size_bytes() == 80
    finally:
        await s.close()


async def test_one_endpoint_at_two_priorities_counts_twice_for_its_quota(store_factory: StoreFactory) -> None:
    s = store_factory(endpoint_policies={"up": policy(max_messages=3)})
    try:
        await s.enqueue(m(0), [RouteResult("up", 0), RouteResult("up", 5)])
        assert s.usage("up") == (2, 20)
        assert s.usage(None) == (1, 10)  # one body
        with pytest.raises(QuotaExceededError, match="endpoint up"):
            await s.enqueue(m(1), [RouteResult("up", 0), RouteResult("up", 5)])  # 2 + 2 > 3
        await s.enqueue(m(2), [RouteResult("up", 5)])  # 2 + 1 fits
        assert s.usage("up") == (3, 30)
    finally:
        await s.close()


async def test_reject_incoming_refuses_when_endpoint_is_full(store_factory: StoreFactory) -> None:
    s = store_factory(endpoint_policies={"up": policy(max_messages=2)})
    try:
        for i in range(2):
            await s.enqueue(m(i), [RouteResult("up", 0), RouteResult("other", 0)])
        with pytest.raises(QuotaExceededError, match="endpoint up"):
            await s.enqueue(m(3), [RouteResult("up", 0), RouteResult("other", 0)])
        assert s.usage("other") == (2, 20)  # refused for every endpoint: nothing stored
        assert s.usage(None) == (2, 20)
    finally:
        await s.close()


async def test_discard_incoming_acknowledges_and_counts_without_storing(store_factory: StoreFactory) -> None:
    s = store_factory(endpoint_policies={"up": policy(max_bytes=25, overflow=Overflow.DISCARD_INCOMING)})
    try:
        for i in range(2):
            await s.enqueue(m(i), [RouteResult("up", 0)])
        receipt = await s.enqueue(m(3), [RouteResult("up", 0), RouteResult("other", 1)])
        assert [q for q, _ in receipt.refs] == [QueueId("other", 1)]
        assert [it.message.body[:1] for it in s.read(Q, 0, 10)] == [b"0", b"1"]
        assert s.removed[RemovalReason.OVERFLOW] == 1
    finally:
        await s.close()


async def test_discard_oldest_evicts_lowest_priority_head_first(store_factory: StoreFactory) -> None:
    s = store_factory(endpoint_policies={"up": policy(max_messages=3, overflow=Overflow.DISCARD_OLDEST)})
    try:
        await s.enqueue(m(0), [RouteResult("up", 0)])
        await s.enqueue(m(1), [RouteResult("up", 7)])
        await s.enqueue(m(2), [RouteResult("up", 7)])
        await s.enqueue(m(3), [RouteResult("up", 0)])
        assert [it.message.body[:1] for it in s.read(QueueId("up", 7), 0, 10)] == [b"2"]
        assert [it.message.body[:1] for it in s.read(Q, 0, 10)] == [b"0", b"3"]
        assert s.removed[RemovalReason.OVERFLOW] == 1
        assert s.usage("up") == (3, 30)
    finally:
        await s.close()


async def test_store_wide_quota_counts_a_message_once(store_factory: StoreFactory) -> None:
    s = store_factory(store_quota=StoreQuota(max_messages=2), default_policy=policy())
    try:
        await s.enqueue(m(0), [RouteResult("a", 0), RouteResult("b", 0)])
        await s.enqueue(m(1), [RouteResult("a", 0), RouteResult("b", 0)])
        assert s.usage(None) == (2, 20)
        assert s.usage("a") == (2, 20)
        with pytest.raises(QuotaExceededError, match="the store"):
            await s.enqueue(m(2), [RouteResult("a", 0)])
    finally:
        await s.close()


async def test_store_wide_discard_oldest_evicts_the_lowest_priority_head_of_any_endpoint(
    store_factory: StoreFactory,
) -> None:
    s = store_factory(store_quota=StoreQuota(max_messages=2), default_policy=policy(overflow=Overflow.DISCARD_OLDEST))
    try:
        await s.enqueue(m(0), [RouteResult("a", 0)])
        await s.enqueue(m(1), [RouteResult("b", 6)])
        receipt = await s.enqueue(m(2), [RouteResult("a", 0)])
        assert receipt.refs == ((QueueId("a", 0), 1),)
        assert s.read(QueueId("b", 6), 0, 10) == []  # b's p6 head went, though a is the one enqueuing
        assert [it.message.body[:1] for it in s.read(QueueId("a", 0), 0, 10)] == [b"0", b"2"]
        assert s.removed[RemovalReason.OVERFLOW] == 1
        assert s.usage(None) == (2, 20)
    finally:
        await s.close()


async def test_store_wide_discard_incoming_drops_the_message_for_every_endpoint(store_factory: StoreFactory) -> None:
    s = store_factory(store_quota=StoreQuota(max_messages=2), default_policy=policy(overflow=Overflow.DISCARD_INCOMING))
    try:
        await s.enqueue(m(0), [RouteResult("a", 0)])
        await s.enqueue(m(1), [RouteResult("b", 0)])
        receipt = await s.enqueue(m(2), [RouteResult("a", 0), RouteResult("b", 3)])
        assert receipt.refs == ()  # acknowledged, stored nowhere
        assert s.usage(None) == (2, 20)
        assert s.usage("a") == s.usage("b") == (1, 10)
        assert s.removed[RemovalReason.OVERFLOW] == 2  # one reference per routed queue
        assert s.discarded_incoming == 1
    finally:
        await s.close()


async def test_discard_oldest_applies_once_the_enqueue_timeout_has_passed(
    store_factory: StoreFactory, clock: ManualClock
) -> None:
    s = store_factory(
        endpoint_policies={"up": QueuePolicy(max_messages=1, enqueue_timeout_s=10, overflow=Overflow.DISCARD_OLDEST)}
    )
    try:
        await s.enqueue(m(0), [RouteResult("up", 0)])
        async with asyncio.timeout(10):
            waiting = asyncio.create_task(s.enqueue(m(1), [RouteResult("up", 0)]))
            await clock.wait_for_sleepers(1)
            clock.advance(9)
            await clock.wait_for_sleepers(1)  # still waiting for space, nothing evicted yet
            assert not waiting.done()
            assert [it.offset for it in s.read(Q, 0, 10)] == [0]
            clock.advance(1)
            receipt = await waiting
        assert receipt.refs == ((Q, 1),)
        assert [it.message.body[:1] for it in s.read(Q, 0, 10)] == [b"1"]
        assert s.removed[RemovalReason.OVERFLOW] == 1
    finally:
        await s.close()


async def test_discard_incoming_applies_once_the_enqueue_timeout_has_passed(
    store_factory: StoreFactory, clock: ManualClock
) -> None:
    s = store_factory(
        endpoint_policies={"up": QueuePolicy(max_messages=1, enqueue_timeout_s=10, overflow=Overflow.DISCARD_INCOMING)}
    )
    try:
        await s.enqueue(m(0), [RouteResult("up", 0)])
        async with asyncio.timeout(10):
            waiting = asyncio.create_task(s.enqueue(m(1), [RouteResult("up", 0), RouteResult("other", 0)]))
            await clock.wait_for_sleepers(1)
            clock.advance(9)
            await clock.wait_for_sleepers(1)
            assert not waiting.done()
            clock.advance(1)
            receipt = await waiting
        assert receipt.refs == ((QueueId("other", 0), 0),)
        assert [it.message.body[:1] for it in s.read(Q, 0, 10)] == [b"0"]
        assert s.removed[RemovalReason.OVERFLOW] == 1
    finally:
        await s.close()


async def test_enqueue_waits_for_space_within_the_timeout(store_factory: StoreFactory, clock: ManualClock) -> None:
    s = store_factory(endpoint_policies={"up": QueuePolicy(max_messages=1, enqueue_timeout_s=10)})
    try:
        await s.enqueue(m(0), [RouteResult("up", 0)])
        async with asyncio.timeout(10):
            waiting = asyncio.create_task(s.enqueue(m(1), [RouteResult("up", 0)]))
            await clock.wait_for_sleepers(1)
            clock.advance(5)
            assert not waiting.done()
            await s.remove(Q, [0], RemovalReason.DELIVERED)  # space frees up before the timeout
            receipt = await waiting
        assert receipt.refs == ((Q, 1),)
    finally:
        await s.close()


async def test_enqueue_timeout_then_overflow_policy_applies(store_factory: StoreFactory, clock: ManualClock) -> None:
    s = store_factory(endpoint_policies={"up": QueuePolicy(max_messages=1, enqueue_timeout_s=10)})
    try:
        await s.enqueue(m(0), [RouteResult("up", 0)])
        async with asyncio.timeout(10):
            waiting = asyncio.create_task(s.enqueue(m(1), [RouteResult("up", 0)]))
            await clock.wait_for_sleepers(1)
            clock.advance(10)
            with pytest.raises(QuotaExceededError):
                await waiting
    finally:
        await s.close()


async def test_usage_survives_reopen_and_follows_removals(store_factory: StoreFactory) -> None:
    s = store_factory()
    r = await s.enqueue(m(0, 50), [RouteResult("a", 0), RouteResult("b", 3)])
    await s.enqueue(m(1, 20), [RouteResult("a", 0)])
    await s.remove(QueueId("a", 0), [r.refs[0][1]], RemovalReason.DELIVERED)
    await s.close()
    s = store_factory()
    try:
        assert s.usage("a") == (1, 20)
        assert s.usage("b") == (1, 50)
        assert s.usage(None) == (2, 70)
        item = s.read(QueueId("b", 3), 0, 1)[0]
        await s.dead_letter(item, reason="invalid", attempts=1)
        assert s.usage("b") == (0, 0)
        assert s.usage(None) == (2, 70)  # the dead letter still holds its body
        await s.purge_dead_letters("b")
        assert s.usage(None) == (1, 20)
    finally:
        await s.close()


def test_policy_refuses_bad_settings() -> None:
    with pytest.raises(ValueError):
        QueuePolicy(enqueue_timeout_s=61)
    with pytest.raises(ValueError):
        QueuePolicy(max_bytes=-1)


async def test_in_memory_store_takes_the_same_policies(clock: ManualClock) -> None:
    s = Store.in_memory(clock=clock, default_policy=policy(max_messages=0))
    try:
        with pytest.raises(QuotaExceededError):
            await s.enqueue(m(0), [RouteResult("up", 0)])
    finally:
        await s.close()
