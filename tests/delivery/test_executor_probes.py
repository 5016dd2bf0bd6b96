"""Probes of a parked endpoint: a probe refused at once is repeated at a steady short interval however long the
outage, so the endpoint is found back soon after it returns; a probe that hung backs off as the policy says."""

from __future__ import annotations

import asyncio
import random

from edgehub.core import FailureKind, Message, RouteResult
from edgehub.delivery import EndpointExecutor, ExecutorSettings, RetryPolicy
from edgehub.store import Store
from edgehub.testing import ManualClock, TestEndpoint

BACKOFF_TO_A_MINUTE = RetryPolicy(minimum_delay_s=1.0, maximum_delay_s=60.0, backoff_retries=7)
SETTINGS = ExecutorSettings(retry_policy=BACKOFF_TO_A_MINUTE, cleanup_interval_s=86_400)


def test_a_probe_refused_at_once_waits_at_most_the_probe_interval_and_a_hung_one_backs_off() -> None:
    policy = BACKOFF_TO_A_MINUTE
    rng = random.Random(3)
    refused = [policy.probe_delay_s(n, FailureKind.TRANSIENT, rng) for n in range(1, 50)]
    assert all(0.75 <= d <= 1.25 for d in refused)
    hung = [policy.probe_delay_s(n, FailureKind.TIMEOUT) for n in range(1, 10)]
    assert hung == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert policy.probe_delay_s(1) == 1.0  # a report, no probe yet: the policy's first delay
    short = RetryPolicy(minimum_delay_retries=5, minimum_delay_s=0.2, maximum_delay_s=0.2, backoff_retries=0)
    assert short.probe_delay_s(3, FailureKind.TRANSIENT) == 0.2  # never longer than the policy's own


async def _probe_waits(store: Store, clock: ManualClock, kind: FailureKind, probes: int) -> list[float]:
    """The waits the executor took between ``probes`` probes of a parked endpoint failing with ``kind``."""
    ep = TestEndpoint("ep")
    ep.fail_next(0, kind)
    waits = []
    async with (
        asyncio.timeout(20),
        EndpointExecutor(store, ep, clock=clock, settings=SETTINGS) as ex,
    ):
        ep.go_down(report=True)
        await store.enqueue(Message(body=b"m"), [RouteResult("ep", 1)])
        ex.notify()
        for n in range(probes):
            await ex.wait_idle()
            await clock.wait_for_sleepers(2)  # cleanup's, and the pump's until the next probe
            deadline = clock.next_deadline()
            assert deadline is not None
            waits.append(deadline - clock.time())
            clock.advance(waits[-1] + 1e-6)  # a hair past it: float sums must not leave the sleeper short
            await ep.wait_sends(n + 1)
    return waits


async def test_a_parked_endpoint_refusing_at_once_is_probed_at_a_steady_interval(
    store: Store, clock: ManualClock
) -> None:
    waits = await _probe_waits(store, clock, FailureKind.TRANSIENT, 10)
    assert all(w <= 1.25 for w in waits)  # before: 1, 1, 2, 4, 8, ... up to 60 s


async def test_a_parked_endpoint_whose_probes_hang_is_probed_less_and_less_often(
    store: Store, clock: ManualClock
) -> None:
    waits = await _probe_waits(store, clock, FailureKind.TIMEOUT, 7)
    assert waits[-1] >= 16.0
