"""Module delivery through EdgeHub with a RecordingLink (no sockets): the window, acks and checkpoints, refusals."""

from __future__ import annotations

import asyncio

import pytest

from edgehub.core import Identity, Message
from edgehub.delivery import ExecutorSettings, ReportsUnreachable, RetryPolicy
from edgehub.hub.facade import EdgeHub
from edgehub.hub.modules import ModuleEndpoint, ModuleMailboxes
from edgehub.routing import Router
from edgehub.store import Store
from edgehub.testing import ManualClock, RecordingLink

pytestmark = pytest.mark.timeout(30)

DEV = Identity.parse("dev1")
MOD = Identity.parse("edge/m")
IN = "/modules/m/inputs/in"
LONG_WAIT = ExecutorSettings(retry_policy=RetryPolicy(minimum_delay_s=600.0, maximum_delay_s=600.0))


def hub_over(store: Store) -> EdgeHub:
    router = Router({"r": f"FROM /messages/* INTO BrokeredEndpoint('{IN}')"})
    return EdgeHub(store=store, router=router, host_name="h", executor_settings=LONG_WAIT)


async def test_no_more_than_the_window_is_in_flight_and_acks_let_the_rest_out_in_order() -> None:
    store = Store.in_memory()
    async with hub_over(store) as hub:
        link = RecordingLink(window=3)
        await hub.connect(MOD, link, clean_session=True)
        await hub.ingest(DEV, [Message(f"m{i}".encode()) for i in range(7)])
        async with asyncio.timeout(10):
            await link.wait_sent(3)
            assert len(link.unacked) == 3
            for n in range(7):
                await link.wait_sent(n + 1)
                assert len(link.unacked) <= 3
                link.ack(hub, MOD)
        assert [d.message.body for d in link.sent] == [f"m{i}".encode() for i in range(7)]
        assert all(d.input_name == "in" and not d.redelivery for d in link.sent)
        [q] = store.queues(IN)
        executor = hub.executors[IN]
        async with asyncio.timeout(10):
            await executor.wait_for(lambda: store.checkpoint(q).committed == 6)


async def test_a_delivery_the_link_refuses_for_good_is_dead_lettered_not_retried() -> None:
    store = Store.in_memory()
    async with hub_over(store) as hub:
        link = RecordingLink()
        link.refuse_permanently = True
        await hub.connect(MOD, link, clean_session=True)
        await hub.ingest(DEV, [Message(b"huge")])
        executor = hub.executors[IN]
        async with asyncio.timeout(10):
            await executor.wait_for(lambda: len(store.dead_letters(IN)) == 1)
        [dead] = store.dead_letters(IN)
        assert dead.message.body == b"huge"
        assert link.sent == []


async def test_a_refused_ack_is_retried_as_a_redelivery() -> None:
    store = Store.in_memory()
    async with hub_over(store) as hub:
        link = RecordingLink()
        await hub.connect(MOD, link, clean_session=True)
        await hub.ingest(DEV, [Message(b"again")])
        async with asyncio.timeout(10):
            await link.wait_sent(1)
        link.ack(hub, MOD, ok=False)
        # The retry wait is 600 s; a reconnect (reachable) cuts it short and the message comes again as DUP.
        link2 = RecordingLink()
        await hub.connect(MOD, link2, clean_session=False)
        async with asyncio.timeout(10):
            await link2.wait_sent(1)
        assert link2.sent[0].redelivery
        assert link2.sent[0].message.body == b"again"


async def test_acks_settled_together_count_each_once_and_an_unknown_delivery_id_is_ignored() -> None:
    store = Store.in_memory()
    async with hub_over(store) as hub:
        link = RecordingLink(window=3)
        await hub.connect(MOD, link, clean_session=True)
        await hub.ingest(DEV, [Message(f"m{i}".encode()) for i in range(3)])
        async with asyncio.timeout(10):
            await link.wait_sent(3)
        d0, d1, d2 = link.sent
        # The acks of one read: two taken, one refused, one for no delivery of this module (ignored).
        hub.delivered_many(
            MOD, [(d0.delivery_id, True), (10**9, True), (d1.delivery_id, True), (d2.delivery_id, False)]
        )
        hub.link_ready(MOD, link)
        [q] = store.queues(IN)
        async with asyncio.timeout(10):
            await hub.executors[IN].wait_for(lambda: store.checkpoint(q).committed == 1)
        # The refused one is owed still: it comes again, as a redelivery, on the next connection.
        link2 = RecordingLink()
        await hub.connect(MOD, link2, clean_session=False)
        async with asyncio.timeout(10):
            await link2.wait_sent(1)
        assert [(d.message.body, d.redelivery) for d in link2.sent] == [(b"m2", True)]


async def test_a_module_that_disconnects_is_not_tried_until_it_connects_again() -> None:
    clock = ManualClock()
    store = Store.in_memory(clock=clock)
    router = Router({"r": f"FROM /messages/* INTO BrokeredEndpoint('{IN}')"})
    async with EdgeHub(store=store, router=router, host_name="h", clock=clock, executor_settings=LONG_WAIT) as hub:
        executor = hub.executors[IN]
        link = RecordingLink()
        await hub.connect(MOD, link, clean_session=True)
        await hub.disconnect(MOD, link)
        assert not executor.reachable
        await hub.ingest(DEV, [Message(b"while away")])
        async with asyncio.timeout(10):
            await executor.wait_idle()
        assert executor.sends.batches == 0  # parked: nothing tried, nothing counted, while the module is away
        link2 = RecordingLink()
        await hub.connect(MOD, link2, clean_session=False)
        async with asyncio.timeout(10):
            await link2.wait_sent(1)
        assert executor.reachable
        assert link2.sent[0].message.body == b"while away"
        assert not link2.sent[0].redelivery  # it was never tried before


def test_module_endpoint_reports_unreachable() -> None:
    assert isinstance(ModuleEndpoint(IN, ModuleMailboxes()), ReportsUnreachable)


async def test_the_delivery_window_changes_live_a_wider_one_fills_at_once_a_narrower_one_drains() -> None:
    store = Store.in_memory()
    async with hub_over(store) as hub:
        hub.set_delivery_window(2)
        link = RecordingLink(window=1000)  # the head's own bound far above: the hub's window is what holds
        await hub.connect(MOD, link, clean_session=True)
        await hub.ingest(DEV, [Message(f"m{i}".encode()) for i in range(12)])
        async with asyncio.timeout(10):
            await link.wait_sent(2)
            assert len(link.unacked) == 2  # the batch was handed over whole: a pump past the window sent more
            hub.set_delivery_window(6)  # wider: filled at once, with no ack to wait for
            await link.wait_sent(6)
            assert len(link.unacked) == 6
            hub.set_delivery_window(3)  # narrower: the six in flight stay, nothing more until below three
            link.ack(hub, MOD)
            link.ack(hub, MOD)
            link.ack(hub, MOD)
            assert (len(link.sent), len(link.unacked)) == (6, 3)
            link.ack(hub, MOD)
            assert (len(link.sent), len(link.unacked)) == (7, 3)
            for n in range(8, 13):
                link.ack(hub, MOD)
                await link.wait_sent(n)
                assert len(link.unacked) <= 3
        assert [d.message.body for d in link.sent] == [f"m{i}".encode() for i in range(12)]


def test_a_delivery_window_outside_1_to_65535_is_refused() -> None:
    mailboxes = ModuleMailboxes()
    for bad in (0, 65_536):
        with pytest.raises(ValueError, match="a delivery window is 1 to 65535"):
            mailboxes.window = bad
    assert mailboxes.window == 16
