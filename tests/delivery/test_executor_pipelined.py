"""The executor with a pipelined endpoint: several batches in flight, each result its own checkpoint."""

from __future__ import annotations

import asyncio

from edgehub.core import Message, RouteResult
from edgehub.delivery import EndpointExecutor, ExecutorSettings, QueuedMessage, RetryPolicy, State
from edgehub.store import QueueId, Store
from edgehub.testing import ManualClock, PipelinedTestEndpoint

HOUR_WAIT = ExecutorSettings(retry_policy=RetryPolicy(minimum_delay_s=3600, maximum_delay_s=3600))
P5 = QueueId("ep", 5)


async def put(store: Store, ex: EndpointExecutor, name: str, priority: int) -> None:
    await store.enqueue(Message(body=name.encode()), [RouteResult("ep", priority, None)])
    ex.notify()


async def fill(store: Store, names: list[str], priority: int) -> None:
    """Enqueue before the executor starts, so that its first batches are full."""
    for name in names:
        await store.enqueue(Message(body=name.encode()), [RouteResult("ep", priority, None)])


def bodies(batch: list[QueuedMessage]) -> list[bytes]:
    return [m.message.body for m in batch]


def held(store: Store, q: QueueId) -> int:
    return len(store.references(q, 0, 1000))


async def test_several_batches_go_before_the_first_ack_and_nothing_is_committed_or_removed_before_its_ack(
    store: Store, clock: ManualClock
) -> None:
    ep = PipelinedTestEndpoint("ep", window=3, max_batch_messages=2)
    await fill(store, [f"m{i}" for i in range(10)], 5)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=HOUR_WAIT) as ex:
        await ep.wait_submitted(3)
        await ex.wait_idle()
        assert len(ep.submitted) == 3  # the window is full: no fourth batch
        assert [bodies(b) for b in ep.submitted] == [[b"m0", b"m1"], [b"m2", b"m3"], [b"m4", b"m5"]]
        await ex.cleanup()
        assert store.checkpoint(P5).committed == -1
        assert held(store, P5) == 10
        ep.ack(1)  # the second batch's ack first: it cannot be committed past the first, still owed
        await ep.wait_submitted(4)
        await ex.wait_idle()
        await ex.cleanup()
        assert store.checkpoint(P5).committed == -1
        assert held(store, P5) == 10
        ep.ack(0)
        await ex.wait_for(lambda: store.checkpoint(P5).committed == 3)
        await ex.cleanup()
        assert held(store, P5) == 6


async def test_a_high_priority_message_goes_as_soon_as_the_window_has_room(store: Store, clock: ManualClock) -> None:
    ep = PipelinedTestEndpoint("ep", window=2, max_batch_messages=2)
    await fill(store, [f"low{i}" for i in range(20)], 5)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=HOUR_WAIT) as ex:
        await ep.wait_submitted(2)
        await put(store, ex, "urgent", 0)
        await ex.wait_idle()
        assert len(ep.submitted) == 2
        ep.ack(0)
        await ep.wait_submitted(3)
        assert bodies(ep.submitted[2]) == [b"urgent"]  # behind the window only, not behind the backlog
        ep.ack(1)
        ep.ack(2)
        await ep.wait_submitted(5)
        assert [m.priority for b in ep.submitted[3:] for m in b] == [5, 5, 5, 5]


async def test_when_the_link_is_lost_every_batch_in_flight_is_retried_in_queue_order(
    store: Store, clock: ManualClock
) -> None:
    ep = PipelinedTestEndpoint("ep", window=3, max_batch_messages=2)
    await fill(store, [f"m{i}" for i in range(6)], 5)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=HOUR_WAIT) as ex:
        await ep.wait_submitted(3)
        ep.lose_link()
        await ex.wait_idle()
        assert len(ep.submitted) == 3  # parked, and the retry waits an hour
        assert store.checkpoint(P5).committed == -1
        ep.revive()  # cuts the wait short
        await ep.wait_submitted(4)
        assert bodies(ep.submitted[3]) == [f"m{i}".encode() for i in range(6)]  # one retry, in order
        ep.ack(3)
        await ex.wait_for(lambda: store.checkpoint(P5).committed == 5)
    assert all(m.attempts == 1 for m in ep.submitted[3])


async def test_a_failed_batch_is_retried_after_a_later_one_succeeded_and_the_checkpoint_waits_for_it(
    store: Store, clock: ManualClock
) -> None:
    ep = PipelinedTestEndpoint("ep", window=2, max_batch_messages=2)
    await fill(store, [f"m{i}" for i in range(4)], 5)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=HOUR_WAIT) as ex:
        await ep.wait_submitted(2)
        ep.fail(0)
        ep.ack(1)
        await ex.wait_for(lambda: ex.sends.batches == 2)
        await ex.wait_idle()
        assert store.checkpoint(P5).committed == -1  # m2, m3 are delivered, but m0 is still owed
        assert ex.state(5) is State.FAILING
        await clock.wait_for_sleepers(2)  # cleanup's sleep and the pump's
        clock.advance(3600)
        await ep.wait_submitted(3)
        assert bodies(ep.submitted[2]) == [b"m0", b"m1"]
        ep.ack(2)
        await ex.wait_for(lambda: store.checkpoint(P5).committed == 3)
        assert ex.state(5) is State.IDLE


async def test_a_short_batch_lingers_while_another_is_in_flight_and_goes_once_it_is_full(
    store: Store, clock: ManualClock
) -> None:
    ep = PipelinedTestEndpoint("ep", window=3, max_batch_messages=3, linger_s=1.0)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=HOUR_WAIT) as ex:
        await put(store, ex, "alone", 5)
        await ep.wait_submitted(1)  # nothing in flight: a short batch goes at once
        await put(store, ex, "a", 5)
        await ex.wait_idle()
        assert len(ep.submitted) == 1  # lingers: a batch is in flight
        await put(store, ex, "b", 5)
        await put(store, ex, "c", 5)
        await ep.wait_submitted(2)  # full: no more lingering
        assert bodies(ep.submitted[1]) == [b"a", b"b", b"c"]
        await put(store, ex, "d", 5)
        await ex.wait_idle()
        assert len(ep.submitted) == 2
        await clock.wait_for_sleepers(2)  # cleanup's sleep and the pump's
        clock.advance(1.0)
        await ep.wait_submitted(3)  # the linger time has passed
        assert bodies(ep.submitted[2]) == [b"d"]


async def test_a_lingering_short_batch_goes_before_any_lower_priority_that_is_ready(
    store: Store, clock: ManualClock
) -> None:
    ep = PipelinedTestEndpoint("ep", window=3, max_batch_messages=3, linger_s=1.0)
    await fill(store, ["low0", "low1", "low2"], 5)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=HOUR_WAIT) as ex:
        await ep.wait_submitted(1)
        await store.enqueue(Message(body=b"urgent"), [RouteResult("ep", 0, None)])
        await fill(store, ["low3", "low4", "low5"], 5)
        ex.notify()
        await ep.wait_submitted(3)
    assert [bodies(b) for b in ep.submitted[1:]] == [[b"urgent"], [b"low3", b"low4", b"low5"]]


async def test_a_lingering_queue_that_gets_parked_waits_for_the_endpoint_without_spinning(
    store: Store, clock: ManualClock
) -> None:
    ep = PipelinedTestEndpoint("ep", window=3, max_batch_messages=3, linger_s=1.0)
    await fill(store, ["a", "b", "c"], 5)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=HOUR_WAIT) as ex:
        await ep.wait_submitted(1)
        await put(store, ex, "short", 5)
        await ex.wait_idle()  # lingering behind the batch in flight
        ep.lose_link()  # the batch fails, the endpoint says it is unreachable: parked for an hour
        await ex.wait_idle()
        await clock.wait_for_sleepers(2)
        clock.advance(2.0)  # past the linger time, still parked
        # The pump sleeps again until the retry time; one that took the passed linger time for a deadline would
        # spin on it and never sleep on the clock.
        await clock.wait_for_sleepers(2)
        assert len(ep.submitted) == 1
        ep.revive()
        await ep.wait_submitted(2)
    assert bodies(ep.submitted[1]) == [b"a", b"b", b"c"]  # the retry first, then the rest
