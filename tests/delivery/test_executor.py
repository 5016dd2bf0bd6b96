"""The endpoint executor against real stores, steerable test endpoints and a manual clock."""

from __future__ import annotations

import asyncio

from edgehub.core import Message, RouteResult
from edgehub.delivery import DeadLetterReason, EndpointExecutor, ExecutorSettings, RetryPolicy, State
from edgehub.store import Overflow, QueueId, QueuePolicy, RemovalReason, Store
from edgehub.testing import ManualClock, TestEndpoint

FAST = RetryPolicy(retries_with_no_delay=0, minimum_delay_retries=3, minimum_delay_s=5, backoff_retries=0)


async def put(store: Store, ex: EndpointExecutor, name: str, priority: int, ttl_s: int | None = None) -> None:
    await store.enqueue(Message(body=name.encode()), [RouteResult("ep", priority, ttl_s)])
    ex.notify()


def bodies(ep: TestEndpoint) -> list[bytes]:
    return [m.message.body for m in ep.delivered]


async def test_executor_delivers_in_queue_order_and_commits(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep", max_batch_messages=3)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock) as ex:
        for i in range(7):
            await put(store, ex, f"m{i}", 1)
        await ep.wait_delivered(7)
        assert bodies(ep) == [f"m{i}".encode() for i in range(7)]
        assert all(len(b) <= 3 for b in ep.batches)
        await ex.wait_for(lambda: store.checkpoint(QueueId("ep", 1)).committed >= 6)
    assert ep.closed


async def test_higher_priority_arriving_during_a_batch_goes_out_next(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep", max_batch_messages=2)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock) as ex:
        ep.stall()
        for i in range(6):
            await put(store, ex, f"low{i}", 5)
        await ep.wait_stalled()  # a P5 batch is in flight, and the next one prefetched
        await put(store, ex, "urgent", 0)
        ep.release()
        await ep.wait_delivered(7)
    priorities = [[m.priority for m in b] for b in ep.batches]
    assert set(priorities[0]) == {5}
    assert priorities[1] == [0]  # the P0 message went out right after the batch in flight
    assert all(len(set(p)) == 1 for p in priorities)  # never mixed
    assert [b for b in bodies(ep) if b != b"urgent"] == [f"low{i}".encode() for i in range(6)]


async def test_expired_message_is_never_sent_and_counted_as_ttl(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep")
    ep.stall()
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock) as ex:
        await put(store, ex, "first", 1)
        await ep.wait_stalled()
        await put(store, ex, "short", 1, ttl_s=10)
        await put(store, ex, "long", 1, ttl_s=1000)
        clock.advance(11)  # "short" expires while "first" is in flight
        ep.release()
        await ep.wait_delivered(2)
    assert bodies(ep) == [b"first", b"long"]
    assert store.removed[RemovalReason.TTL] == 1


async def test_transient_failure_is_retried_after_the_policy_delay(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep")
    ep.fail_next(2)
    settings = ExecutorSettings(retry_policy=FAST)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await put(store, ex, "m", 1)
        await ep.wait_sends(1)
        await clock.wait_for_sleepers(2)  # cleanup's sleep and the retry wait
        assert clock.next_deadline() == clock.time() + 5
        assert ex.state(1) is State.FAILING
        assert store.checkpoint(QueueId("ep", 1)).unhealthy_since_s == clock.time()  # health is persisted
        clock.advance(5)
        await ep.wait_sends(2)
        await clock.wait_for_sleepers(2)
        assert ep.delivered == []
        clock.advance(5)
        await ep.wait_delivered(1)
        await ex.wait_for(lambda: store.checkpoint(QueueId("ep", 1)).committed >= 0)
    assert ep.delivered[0].attempts == 2
    assert store.checkpoint(QueueId("ep", 1)).unhealthy_since_s is None


async def test_revived_endpoint_cuts_the_retry_wait_short(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep")
    ep.go_down()
    settings = ExecutorSettings(
        retry_policy=RetryPolicy(minimum_delay_retries=10, minimum_delay_s=3600, maximum_delay_s=3600)
    )
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await put(store, ex, "m", 1)
        await ep.wait_sends(1)
        await clock.wait_for_sleepers(2)
        ep.revive()  # no clock movement: only the reachability callback can wake the executor
        await ep.wait_delivered(1)
        await ex.wait_for(lambda: store.checkpoint(QueueId("ep", 1)).committed >= 0)
    assert ep.sends == 2
    assert store.checkpoint(QueueId("ep", 1)).last_revival_s == clock.time()


async def test_invalid_message_is_dead_lettered_and_the_rest_delivered(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep")
    ep.reject_when(lambda m: m.body == b"bad")
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock) as ex:
        for name in ("a", "bad", "c"):
            await put(store, ex, name, 2)
        await ep.wait_delivered(2)
        await ex.wait_for(lambda: store.checkpoint(QueueId("ep", 2)).committed >= 2)
    (dl,) = store.dead_letters("ep")
    assert (dl.message.body, dl.reason, dl.attempts) == (b"bad", DeadLetterReason.INVALID, 1)
    assert bodies(ep) == [b"a", b"c"]
    assert store.removed[RemovalReason.DEADLETTER] == 1


async def test_message_failing_max_delivery_attempts_is_dead_lettered(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep")
    ep.go_down()
    settings = ExecutorSettings(retry_policy=RetryPolicy(retries_with_no_delay=10), max_delivery_attempts=3)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await put(store, ex, "doomed", 1)
        await ex.wait_for(lambda: bool(store.dead_letters("ep")))
    (dl,) = store.dead_letters("ep")
    assert (dl.reason, dl.attempts) == (DeadLetterReason.MAX_DELIVERY_ATTEMPTS, 3)
    assert ep.sends == 3


async def test_exhausted_retry_policy_dead_letters_then_requeue_delivers(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep")
    ep.go_down()
    settings = ExecutorSettings(
        retry_policy=RetryPolicy(retries_with_no_delay=1, backoff_retries=0, maximum_delay_retries=0)
    )
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await put(store, ex, "m", 1)
        await ex.wait_for(lambda: bool(store.dead_letters("ep")))
        (dl,) = store.dead_letters("ep")
        assert (dl.reason, dl.attempts) == (DeadLetterReason.RETRY_EXHAUSTED, 2)
        ep.revive()
        assert await store.requeue_dead_letters("ep") == 1
        ex.notify()
        await ep.wait_delivered(1)
    assert bodies(ep) == [b"m"]


async def test_restart_resumes_after_the_committed_offset(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep", max_batch_messages=1)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock) as ex:
        for i in range(3):
            await put(store, ex, f"m{i}", 1)
        await ep.wait_delivered(3)
        await ex.wait_for(lambda: store.checkpoint(QueueId("ep", 1)).committed >= 2)
    await store.enqueue(Message(body=b"m3"), [RouteResult("ep", 1)])
    ep2 = TestEndpoint("ep")
    async with asyncio.timeout(10), EndpointExecutor(store, ep2, clock=clock):
        await ep2.wait_delivered(1)
    assert bodies(ep2) == [b"m3"]


async def test_cleanup_removes_delivered_head_only_by_default(store: Store, clock: ManualClock) -> None:
    q = QueueId("ep", 1)
    ep = TestEndpoint("ep")
    ep.go_down()
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock) as ex:
        await put(store, ex, "live", 1)
        await put(store, ex, "expiring", 1, ttl_s=5)
        await ep.wait_sends(1)
        clock.advance(6)
        removed = await ex.cleanup()
    # head-only: "live" is owed, so the expired one behind it stays until whole-queue cleanup
    assert removed == {RemovalReason.DELIVERED: 0, RemovalReason.TTL: 0}
    assert store.count(q) == 2
    whole = ExecutorSettings(check_entire_queue_on_cleanup=True)
    async with asyncio.timeout(10), EndpointExecutor(store, TestEndpoint("ep"), clock=clock, settings=whole) as ex2:
        ex2_removed = await ex2.cleanup()
    assert ex2_removed[RemovalReason.TTL] == 1


async def test_cleanup_deletes_delivered_references_and_their_bodies(store: Store, clock: ManualClock) -> None:
    q = QueueId("ep", 1)
    ep = TestEndpoint("ep")
    settings = ExecutorSettings(cleanup_interval_s=60)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await put(store, ex, "a", 1)
        await put(store, ex, "b", 1)
        await ep.wait_delivered(2)
        await ex.wait_for(lambda: store.checkpoint(q).committed >= 1)
        keys = [m.offset for m in ep.delivered]
        assert keys == [0, 1]
        clock.advance(60)  # the cleanup processor's own interval
        await ex.wait_for(lambda: ex.cleanups_run >= 1)
    assert store.count(q) == 0
    assert store.removed[RemovalReason.DELIVERED] == 2


async def test_hub_policy_ignoring_overrides_governs_the_endpoint(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep")
    ep.go_down()
    hub = RetryPolicy(
        retries_with_no_delay=1, backoff_retries=0, maximum_delay_retries=0, ignore_endpoint_override=True
    )
    settings = ExecutorSettings(retry_policy=hub, endpoint_retry_policy=RetryPolicy())  # override: retry for ever
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await put(store, ex, "m", 1)
        await ex.wait_for(lambda: bool(store.dead_letters("ep")))
    assert store.dead_letters("ep")[0].reason == DeadLetterReason.RETRY_EXHAUSTED


async def test_queue_failing_past_the_threshold_is_dead_until_revived(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep")
    ep.go_down()
    settings = ExecutorSettings(retry_policy=FAST, unhealthy_after_s=10)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await put(store, ex, "m", 1)
        for sends in (1, 2):
            await ep.wait_sends(sends)
            await clock.wait_for_sleepers(2)
            assert ex.state(1) is State.FAILING
            clock.advance(5)
        await ep.wait_sends(3)
        await clock.wait_for_sleepers(2)
        assert ex.state(1) is State.DEAD  # failing for 10 s now
        ep.revive()
        await ex.wait_for(lambda: store.checkpoint(QueueId("ep", 1)).committed == 0)
        assert ex.state(1) is State.IDLE


HOUR_WAIT = RetryPolicy(minimum_delay_retries=10, minimum_delay_s=3600, maximum_delay_s=3600, backoff_retries=0)


async def test_failing_low_priority_batch_does_not_hold_back_a_new_high_priority_message(
    store: Store, clock: ManualClock
) -> None:
    ep = TestEndpoint("ep")
    ep.fail_next(1)
    settings = ExecutorSettings(retry_policy=HOUR_WAIT)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await put(store, ex, "low", 5)
        await ep.wait_sends(1)
        await clock.wait_for_sleepers(2)  # cleanup's sleep and the P5 retry, an hour away
        await put(store, ex, "urgent", 0)
        await ep.wait_delivered(1)  # the clock has not moved: only the pump's choice can send it
        assert bodies(ep) == [b"urgent"]
        assert ex.state(5) is State.FAILING
        clock.advance(3600)
        await ep.wait_delivered(2)
    assert bodies(ep) == [b"urgent", b"low"]
    assert ep.sends == 3


async def test_after_an_outage_queued_high_priority_goes_before_the_retry_of_a_failed_batch(
    store: Store, clock: ManualClock
) -> None:
    ep = TestEndpoint("ep", max_batch_messages=100)
    ep.go_down()
    settings = ExecutorSettings(retry_policy=HOUR_WAIT)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        for i in range(100):
            await store.enqueue(Message(body=f"low{i}".encode()), [RouteResult("ep", 5)])
        ex.notify()
        await ep.wait_sends(1)
        await clock.wait_for_sleepers(2)
        for i in range(3):
            await store.enqueue(Message(body=f"urgent{i}".encode()), [RouteResult("ep", 0)])
        ex.notify()
        await ex.wait_for(lambda: ex.state(0) is State.FAILING)  # the link is still down: P0 failed too
        ep.revive()
        await ep.wait_delivered(103)
    assert bodies(ep)[:3] == [b"urgent0", b"urgent1", b"urgent2"]
    assert bodies(ep)[3:] == [f"low{i}".encode() for i in range(100)]
    assert [len(b) for b in ep.batches] == [3, 100]


async def test_message_expiring_during_a_retry_wait_is_removed_not_sent(store: Store, clock: ManualClock) -> None:
    q = QueueId("ep", 1)
    ep = TestEndpoint("ep")
    ep.fail_next(1)
    settings = ExecutorSettings(retry_policy=RetryPolicy(minimum_delay_retries=5, minimum_delay_s=20))
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await store.enqueue(Message(body=b"short"), [RouteResult("ep", 1, 10)])
        await put(store, ex, "long", 1, ttl_s=1000)  # one batch with "short"
        await ep.wait_sends(1)
        await clock.wait_for_sleepers(2)
        clock.advance(20)  # "short" expires during the wait
        await ep.wait_delivered(1)
        await ex.wait_for(lambda: store.checkpoint(q).committed == 1)
    assert bodies(ep) == [b"long"]
    assert ep.sends == 2
    assert store.removed[RemovalReason.TTL] == 1
    assert store.removed[RemovalReason.DELIVERED] == 1  # "long": removed with the checkpoint that delivered it
    assert store.count(q) == 0


async def test_reference_evicted_during_a_retry_wait_is_not_sent_again(clock: ManualClock) -> None:
    q = QueueId("ep", 1)
    oldest = QueuePolicy(max_messages=2, overflow=Overflow.DISCARD_OLDEST, enqueue_timeout_s=0)
    store = Store.in_memory(clock=clock, endpoint_policies={"ep": oldest})
    ep = TestEndpoint("ep")
    ep.fail_next(1)
    settings = ExecutorSettings(retry_policy=FAST)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await store.enqueue(Message(body=b"a"), [RouteResult("ep", 1)])
        await put(store, ex, "b", 1)  # one batch with "a"
        await ep.wait_sends(1)
        await clock.wait_for_sleepers(2)
        await put(store, ex, "c", 1)  # the queue is full: "a", owed to the retry, is evicted
        assert store.removed[RemovalReason.OVERFLOW] == 1
        clock.advance(5)
        await ep.wait_delivered(2)
        await ex.wait_for(lambda: store.checkpoint(q).committed == 2)
    await store.close()
    assert bodies(ep) == [b"b", b"c"]


async def test_reference_cleaned_up_during_a_retry_wait_is_not_sent_and_counted_once(
    store: Store, clock: ManualClock
) -> None:
    q = QueueId("ep", 1)
    ep = TestEndpoint("ep")
    ep.fail_next(1)
    settings = ExecutorSettings(
        retry_policy=RetryPolicy(minimum_delay_retries=5, minimum_delay_s=20), check_entire_queue_on_cleanup=True
    )
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await store.enqueue(Message(body=b"long"), [RouteResult("ep", 1, 1000)])
        await put(store, ex, "short", 1, ttl_s=10)  # one batch with "long"
        await ep.wait_sends(1)
        await clock.wait_for_sleepers(2)
        clock.advance(11)
        assert (await ex.cleanup())[RemovalReason.TTL] == 1  # the whole queue: "short", behind "long"
        clock.advance(9)
        await ep.wait_delivered(1)
        await ex.wait_for(lambda: store.checkpoint(q).committed == 1)
    assert bodies(ep) == [b"long"]
    assert store.removed[RemovalReason.TTL] == 1


async def test_reachable_signal_before_a_failure_does_not_cut_its_wait_short(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep")
    settings = ExecutorSettings(retry_policy=FAST)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        ep.revive()  # nothing waits for it
        clock.advance(3 * 3600)
        ep.fail_next(1)
        await put(store, ex, "m", 1)
        await ep.wait_sends(1)
        await clock.wait_for_sleepers(2)  # the retry waits its full delay
        assert clock.next_deadline() == clock.time() + 5
        assert ep.sends == 1
        clock.advance(5)
        await ep.wait_delivered(1)
    assert ep.delivered[0].attempts == 1


async def test_next_batch_is_read_while_one_is_in_flight(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep", max_batch_messages=2)
    for i in range(6):
        await store.enqueue(Message(body=f"m{i}".encode()), [RouteResult("ep", 3)])
    ep.stall()
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock) as ex:
        await ep.wait_stalled()
        await ex.wait_for(lambda: ex.batches_prefetched == 1)  # read while the first batch is stalled
        assert ep.sends == 1
        ep.release()
        await ep.wait_delivered(6)
        await ex.wait_for(lambda: store.checkpoint(QueueId("ep", 3)).committed == 5)
    assert [[m.offset for m in b] for b in ep.batches] == [[0, 1], [2, 3], [4, 5]]
    assert ex.batches_prefetched == 2


async def test_unreachable_endpoint_parks_new_messages_until_it_reports_reachable(
    store: Store, clock: ManualClock
) -> None:
    ep = TestEndpoint("ep")
    settings = ExecutorSettings(retry_policy=HOUR_WAIT)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        ep.go_down(report=True)
        assert not ex.reachable
        await put(store, ex, "m", 1)
        await ex.wait_idle()
        assert ep.sends == 0  # parked: nothing is tried while the endpoint says it cannot deliver
        ep.revive()
        await ep.wait_delivered(1)
        assert ex.reachable
    assert ep.sends == 1
    assert ep.delivered[0].attempts == 0


PROBE_EVERY_5S = RetryPolicy(
    minimum_delay_retries=2, minimum_delay_s=5, maximum_delay_s=5, backoff_retries=0, maximum_delay_retries=0
)


async def test_parked_endpoint_is_probed_after_the_retry_delay_without_counting_attempts(
    store: Store, clock: ManualClock
) -> None:
    ep = TestEndpoint("ep")
    settings = ExecutorSettings(retry_policy=PROBE_EVERY_5S, max_delivery_attempts=2)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        ep.go_down(report=True)
        await put(store, ex, "m", 1)
        for probes in range(1, 5):  # more probes than max_delivery_attempts, and than the policy's retries
            await ex.wait_idle()
            assert ep.sends == probes - 1
            await clock.wait_for_sleepers(2)  # cleanup's, and the pump's until the next probe
            clock.advance(5)
            await ep.wait_sends(probes)
        await ex.wait_idle()
        assert store.dead_letters("ep") == []
        assert ex.state(1) is State.FAILING
        ep.revive()
        await ep.wait_delivered(1)
    assert ep.delivered[0].attempts == 0


async def test_probe_that_succeeds_unparks_the_endpoint(store: Store, clock: ManualClock) -> None:
    ep = TestEndpoint("ep")
    settings = ExecutorSettings(retry_policy=PROBE_EVERY_5S)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        ep.go_down(report=True)
        await put(store, ex, "a", 1)
        await clock.wait_for_sleepers(2)
        ep.revive(report=False)
        clock.advance(5)  # the probe finds it back
        await ep.wait_delivered(1)
        assert ex.reachable
        await put(store, ex, "b", 2)
        await ep.wait_delivered(2)
    assert bodies(ep) == [b"a", b"b"]


async def test_send_in_flight_when_the_endpoint_reports_unreachable_counts_its_attempt(
    store: Store, clock: ManualClock
) -> None:
    ep = TestEndpoint("ep")
    ep.stall()
    settings = ExecutorSettings(retry_policy=HOUR_WAIT)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        await put(store, ex, "m", 1)
        await ep.wait_stalled()
        ep.go_down(report=True)  # the link drops under the send: it may have reached the peer
        ep.release()
        await ep.wait_sends(1)
        await ex.wait_for(lambda: ex.state(1) is State.FAILING)
        ep.revive()
        await ep.wait_delivered(1)
    assert ep.delivered[0].attempts == 1  # so a module sees the retry as a redelivery (DUP)


async def test_while_unreachable_queued_high_priority_waits_and_goes_first_when_the_endpoint_is_back(
    store: Store, clock: ManualClock
) -> None:
    ep = TestEndpoint("ep", max_batch_messages=100)
    ep.go_down()
    settings = ExecutorSettings(retry_policy=HOUR_WAIT)
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        for i in range(100):
            await store.enqueue(Message(body=f"low{i}".encode()), [RouteResult("ep", 5)])
        ex.notify()
        await ep.wait_sends(1)
        await ex.wait_for(lambda: ex.state(5) is State.FAILING)
        ep.go_down(report=True)  # the transport notices
        for i in range(3):
            await store.enqueue(Message(body=f"urgent{i}".encode()), [RouteResult("ep", 0)])
        ex.notify()
        await ex.wait_idle()
        assert ep.sends == 1  # P0 is parked, not sent into a dead link
        ep.revive()
        await ep.wait_delivered(103)
    assert bodies(ep)[:3] == [b"urgent0", b"urgent1", b"urgent2"]
    assert [m.attempts for m in ep.delivered[:3]] == [0, 0, 0]
    assert [len(b) for b in ep.batches] == [3, 100]
    assert ep.sends == 3


async def test_head_only_cleanup_removes_an_expired_head_longer_than_one_read(store: Store, clock: ManualClock) -> None:
    q = QueueId("ep", 1)
    ep = TestEndpoint("ep")
    ep.fail_next(1)
    settings = ExecutorSettings(retry_policy=RetryPolicy(minimum_delay_retries=5, minimum_delay_s=20))
    async with asyncio.timeout(10), EndpointExecutor(store, ep, clock=clock, settings=settings) as ex:
        for i in range(300):
            await store.enqueue(Message(body=b"s%d" % i), [RouteResult("ep", 1, 10)])
        for i in range(5):
            await store.enqueue(Message(body=b"l%d" % i), [RouteResult("ep", 1, 1000)])
        ex.notify()
        await ep.wait_sends(1)  # the first batch failed: it waits 20 s for its retry, the rest behind it
        await clock.wait_for_sleepers(2)
        clock.advance(11)
        assert await ex.cleanup() == {RemovalReason.DELIVERED: 0, RemovalReason.TTL: 300}
        assert [r.offset for r in store.references(q, 0, 1000)] == [300, 301, 302, 303, 304]
        clock.advance(9)
        await ep.wait_delivered(5)
        await ex.wait_for(lambda: store.checkpoint(q).committed == 304)
    assert bodies(ep) == [b"l%d" % i for i in range(5)]
    assert store.removed[RemovalReason.TTL] == 300
