"""Two links to one Mosquitto, each through its own link simulator, under the endpoint executor with a RocksDB store:
the cheap link carries everything while it is up; a hard cut or a silent outage hands the alarms to the metered
link and leaves telemetry in the store; the cheap link is used again once it stayed up for its settle time; past
its budget the metered link carries only the priorities allowed past it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgehub.core import Message, RouteResult
from edgehub.delivery import CarriesPriorities, EndpointExecutor, ExecutorSettings, RetryPolicy, State
from edgehub.store import QueueId, Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing.linksim import LinkSim
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer
from edgehub.upstream.budget import Budget, BudgetLedger, BudgetMark, Period
from edgehub.upstream.links import LinkedUpstream, LinkSpec, LinkState
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.segment import decode_segment

pytestmark = pytest.mark.timeout(120)

QUICK = ExecutorSettings(retry_policy=RetryPolicy(minimum_delay_s=0.2, maximum_delay_s=0.5), cleanup_interval_s=3600)
P0, P1, P5 = (QueueId("$upstream", p) for p in (0, 1, 5))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_rocks_store(tmp_path / "db")
    yield s
    await s.close()


@pytest.fixture
async def cheap(broker: MosquittoPeer) -> AsyncIterator[LinkSim]:
    async with LinkSim(target_host=broker.host, target_port=broker.port) as sim:
        yield sim


@pytest.fixture
async def metered(broker: MosquittoPeer) -> AsyncIterator[LinkSim]:
    async with LinkSim(target_host=broker.host, target_port=broker.port) as sim:
        yield sim


def mqtt(link: LinkSim, client_id: str) -> MqttUpstream:
    return MqttUpstream(
        MqttUpstreamSettings(
            host="127.0.0.1",
            port=link.port,
            client_id=client_id,
            hub_id="hub1",
            keepalive_s=1,
            ack_timeout_s=2.0,
            connect_timeout_s=2.0,
            reconnect_min_s=0.1,
            reconnect_max_s=0.5,
        )
    )


def lane(
    cheap: LinkSim,
    metered: LinkSim,
    *,
    settle_s: float = 1.0,
    budgets: tuple[Budget, ...] = (),
    ledger_path: Path | None = None,
) -> LinkedUpstream:
    cell = LinkSpec(name="cell", cost_per_mib=0.0, settle_s=settle_s)
    sat = LinkSpec(
        name="sat",
        cost_per_mib=8.0,
        budgets=budgets,
        priorities=frozenset({0, 1}),
        over_budget=frozenset({0}) if budgets else frozenset(),
    )
    # Given in the "wrong" order: the cheaper link is preferred whatever the order.
    ledger = BudgetLedger(ledger_path, {"sat": (sat.budgets, 8.0), "cell": ((), 0.0)})
    return LinkedUpstream([(sat, mqtt(metered, "hub1-sat")), (cell, mqtt(cheap, "hub1"))], ledger)


async def enqueue(store: Store, ex: EndpointExecutor, priority: int, *bodies: bytes) -> None:
    for body in bodies:
        await store.enqueue(Message(body=body), [RouteResult("$upstream", priority, None)])
    ex.notify()


def bodies_received(sink: MqttCollector) -> list[bytes]:
    return [r.body for m in sink.messages for r in decode_segment(m.payload)]


async def arrived(sink: MqttCollector, *bodies: bytes) -> None:
    """Wait until every one of ``bodies`` reached the cloud's subscriber (its PUBACK to the hub comes first)."""
    while not set(bodies) <= set(bodies_received(sink)):
        await sink.wait_for(len(sink.messages) + 1)


async def connected(up: LinkedUpstream) -> None:
    for t in up.transports:
        assert isinstance(t, MqttUpstream)
        await t.wait_connected()


def state(up: LinkedUpstream, name: str) -> LinkState:
    return next(s.state for s in up.links_status() if s.name == name)


@contextlib.asynccontextmanager
async def delivering(
    store: Store, broker: MosquittoPeer, up: LinkedUpstream
) -> AsyncIterator[tuple[MqttCollector, EndpointExecutor]]:
    """``up`` under an executor on ``store``, both links connected, and the cloud's subscriber; 60 s at most."""
    async with (
        asyncio.timeout(60),
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
        up,
        EndpointExecutor(store, up, settings=QUICK) as ex,
    ):
        await connected(up)
        yield sink, ex


async def test_a_linked_upstream_says_which_priorities_it_carries(
    store: Store, broker: MosquittoPeer, cheap: LinkSim, metered: LinkSim
) -> None:
    up = lane(cheap, metered)
    assert isinstance(up, CarriesPriorities)
    async with asyncio.timeout(30), up:
        await connected(up)
        assert up.carries(0)
        assert up.carries(5)
        statuses = {s.name: s for s in up.links_status()}
        assert statuses["cell"].preference == 0
        assert statuses["cell"].carries_now == "0-10"
        assert statuses["sat"].carries_now == ""
        assert statuses["sat"].priorities == "0-1"
        cheap.cut()
        await up.wait_for(lambda: not up.carries(5))
        assert up.carries(0)
        assert up.carries(1)
        assert not up.carries(5)
        assert {s.name: s.carries_now for s in up.links_status()} == {"sat": "0-1", "cell": ""}


async def test_a_hard_cut_hands_alarms_to_the_metered_link_and_telemetry_waits_for_the_cheap_one(
    store: Store, broker: MosquittoPeer, cheap: LinkSim, metered: LinkSim
) -> None:
    up = lane(cheap, metered, settle_s=0.5)
    async with delivering(store, broker, up) as (sink, ex):
        await enqueue(store, ex, 0, b"alarm-before")
        await sink.wait_for(1)
        sat_before = metered.stats.up_bytes
        assert cheap.stats.up_bytes > 0
        cheap.cut()
        await enqueue(store, ex, 5, *(b"telemetry-%d" % i for i in range(20)))
        await enqueue(store, ex, 0, b"alarm-during")
        await ex.wait_for(lambda: store.checkpoint(P0).committed == 1)
        await arrived(sink, b"alarm-during")
        assert metered.stats.up_bytes > sat_before  # it went over the metered link
        # Telemetry waits in the store: not sent, no attempt counted, its queue not failing.
        assert store.checkpoint(P5).committed == -1
        assert ex.state(5) is not State.FAILING
        assert not any(b.startswith(b"telemetry") for b in bodies_received(sink))
        cheap.restore()
        await ex.wait_for(lambda: store.checkpoint(P5).committed == 19)
        await arrived(sink, *(b"telemetry-%d" % i for i in range(20)))


async def test_a_silent_outage_is_found_within_the_keepalive_and_alarms_go_over_the_metered_link(
    store: Store, broker: MosquittoPeer, cheap: LinkSim, metered: LinkSim
) -> None:
    up = lane(cheap, metered)
    async with delivering(store, broker, up) as (sink, ex):
        cheap.go_silent()  # no FIN, no RST: only the keepalive (1 s, lost after 1.5 s of silence) tells
        await enqueue(store, ex, 0, *(b"alarm-%d" % i for i in range(5)))
        await ex.wait_for(lambda: store.checkpoint(P0).committed == 4)
        await arrived(sink, *(b"alarm-%d" % i for i in range(5)))
        assert state(up, "cell") is LinkState.DOWN
        assert metered.stats.up_bytes > 0


async def test_the_cheap_link_is_used_again_only_after_it_stayed_up_for_its_settle_time(
    store: Store, broker: MosquittoPeer, cheap: LinkSim, metered: LinkSim
) -> None:
    up = lane(cheap, metered, settle_s=3.0)
    async with delivering(store, broker, up) as (sink, ex):
        cheap.cut()
        await up.wait_for(lambda: state(up, "cell") is LinkState.DOWN)
        cheap.restore()
        await up.wait_for(lambda: state(up, "cell") is LinkState.SETTLING)
        # Settling: alarms keep to the metered link, telemetry (no other link) takes the cheap one at once.
        cell_before, sat_before = cheap.stats.up_bytes, metered.stats.up_bytes
        await enqueue(store, ex, 0, b"alarm-settling")
        await ex.wait_for(lambda: store.checkpoint(P0).committed == 0)
        assert metered.stats.up_bytes > sat_before
        await enqueue(store, ex, 5, b"telemetry-settling")
        await ex.wait_for(lambda: store.checkpoint(P5).committed == 0)
        assert cheap.stats.up_bytes > cell_before
        await up.wait_for(lambda: state(up, "cell") is LinkState.UP)
        sat_before = metered.stats.up_bytes
        await enqueue(store, ex, 0, b"alarm-settled")
        await ex.wait_for(lambda: store.checkpoint(P0).committed == 1)
        await sink.wait_for(3)
        assert metered.stats.up_bytes - sat_before < 20  # a PINGREQ at most, no PUBLISH
        assert {s.name: s.carries_now for s in up.links_status()}["cell"] == "0-10"


@pytest.mark.parametrize(
    ("budgets", "spent"),
    [
        ((Budget(2_000, Period.DAY),), Period.DAY),
        # a month's budget spent with the day's far from it: past any budget is past the budget
        ((Budget(10**9, Period.DAY), Budget(2_000, Period.MONTH)), Period.MONTH),
    ],
    ids=["day", "month-of-two"],
)
async def test_past_its_budget_the_metered_link_carries_only_the_priorities_allowed_past_it(
    budgets: tuple[Budget, ...],
    spent: Period,
    store: Store,
    broker: MosquittoPeer,
    cheap: LinkSim,
    metered: LinkSim,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="edgehub.upstream.budget")
    up = lane(cheap, metered, budgets=budgets, ledger_path=tmp_path / "links" / "budget.json")
    async with delivering(store, broker, up) as (sink, ex):
        cheap.cut()
        await up.wait_for(lambda: not up.carries(5))
        events = [b"event-%03d-%s" % (i, b"x" * 200) for i in range(30)]  # ~6 kB: three times the budget
        for body in events:
            await enqueue(store, ex, 1, body)
        await up.wait_for(lambda: up.ledger.spent("sat"))
        await up.wait_for(lambda: not up.carries(1))
        held = store.checkpoint(P1).committed
        assert held < 29  # the rest waits for the cheap link
        assert up.carries(0)  # the alarms still go
        await enqueue(store, ex, 0, b"alarm-over-budget")
        await ex.wait_for(lambda: store.checkpoint(P0).committed == 0)
        await arrived(sink, b"alarm-over-budget")
        sat = next(s for s in up.links_status() if s.name == "sat")
        assert sat.budget_mark is BudgetMark.SPENT
        assert sat.period is spent
        assert sat.budget_left_bytes == 0
        assert sat.bytes_this_period >= 2_000
        assert sat.cost_this_period == pytest.approx(sat.bytes_this_period / 2**20 * 8.0)
        assert sat.carries_now == "0"
        marks = [r.getMessage().split()[:3] for r in caplog.records if r.getMessage().startswith("link.budget_")]
        assert marks == [
            ["link.budget_80", "link=sat", f"period={spent}"],
            ["link.budget_100", "link=sat", f"period={spent}"],
        ]
        cheap.restore()
        await ex.wait_for(lambda: store.checkpoint(P1).committed == 29)
        await arrived(sink, *events)
    # Closed: the ledger is on disk, and a new one (a restart) remembers the period's bytes.
    again = BudgetLedger(tmp_path / "links" / "budget.json", {"sat": (budgets, 8.0), "cell": ((), 0.0)})
    assert again.used_bytes("sat") == sat.bytes_this_period
    assert again.count("sat").mark is BudgetMark.SPENT
