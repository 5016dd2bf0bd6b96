"""An endpoint that carries only some priorities now (``CarriesPriorities``, as an upstream over several links): the
executor leaves the other queues alone, new messages and retries alike, counts no attempt, does not spin on their
past retry times, and sends them once the endpoint reports it carries them."""

from __future__ import annotations

import asyncio

from edgehub.core import Message, RouteResult
from edgehub.delivery import CarriesPriorities, EndpointExecutor, ExecutorSettings, RetryPolicy, State
from edgehub.store import QueueId, Store
from edgehub.testing import GatedTestEndpoint, ManualClock

SETTINGS = ExecutorSettings(
    retry_policy=RetryPolicy(minimum_delay_s=1.0, maximum_delay_s=1.0), max_delivery_attempts=2, cleanup_interval_s=3600
)


async def enqueue(store: Store, ex: EndpointExecutor, priority: int, *bodies: bytes) -> None:
    for body in bodies:
        await store.enqueue(Message(body=body), [RouteResult("test", priority, None)])
    ex.notify()


def test_the_gated_test_endpoint_is_one() -> None:
    assert isinstance(GatedTestEndpoint(), CarriesPriorities)


async def test_a_priority_the_endpoint_does_not_carry_waits_without_attempts_while_others_go(
    store: Store, clock: ManualClock
) -> None:
    ep = GatedTestEndpoint(carried={0, 1})
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=SETTINGS) as ex:
        await enqueue(store, ex, 5, b"telemetry-1", b"telemetry-2")
        await enqueue(store, ex, 0, b"alarm")
        await ep.wait_delivered(1)
        await ex.wait_idle()
        clock.advance(3600)  # an hour: no retry, no attempt, nothing dead-lettered
        await ex.wait_idle()
        assert [m.message.body for m in ep.delivered] == [b"alarm"]
        assert ep.sends == 1
        assert ex.state(5) is State.IDLE
        assert store.checkpoint(QueueId("test", 5)).committed == -1
        ep.carry({0, 1, 5})
        await ep.wait_delivered(3)
        assert [m.message.body for m in ep.delivered[1:]] == [b"telemetry-1", b"telemetry-2"]
        assert all(m.attempts == 0 for m in ep.delivered)


async def test_a_failed_batch_of_a_priority_no_longer_carried_waits_and_goes_when_carried_again(
    store: Store, clock: ManualClock
) -> None:
    ep = GatedTestEndpoint(carried={0, 5})
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=SETTINGS) as ex:
        ep.fail_next(1)
        await enqueue(store, ex, 5, b"telemetry")
        await ep.wait_sends(1)
        await ex.wait_idle()
        assert ex.state(5) is State.FAILING
        ep.carried = frozenset({0})  # its link went away before the retry was due
        clock.advance(10)  # past the retry time: the pump must neither retry nor spin on that time
        await ex.wait_idle()
        asked = ep.asked
        await ex.wait_idle()
        assert ep.asked == asked  # idle, not spinning
        assert ep.sends == 1
        ep.carry({0, 5})
        await ep.wait_delivered(1)
        assert ep.delivered[0].message.body == b"telemetry"
        assert ep.sends == 2
        await ex.wait_for(lambda: store.checkpoint(QueueId("test", 5)).committed == 0)
