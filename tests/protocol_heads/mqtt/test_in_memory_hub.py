"""The in-memory hub the head is tested against: it must itself behave as the Hub protocol promises."""

from __future__ import annotations

import asyncio
import base64

import pytest

from edgehub.core import AuthenticationError, DeliveryError, FailureKind, Identity, Message
from edgehub.core.refusals import RefusalReason
from edgehub.core.sas import generate_sas_token
from edgehub.hub import Credentials, Delivery, Hub, Rejected, Stored
from edgehub.testing import InMemoryHub, ManualClock

MOD = Identity.parse("d/m")
KEY = base64.b64encode(b"k" * 32).decode()


class Link:
    """A client link with a fixed window that records what it was sent."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.sent: list[Delivery] = []
        self.acked = 0
        self.closed = False

    @property
    def window_free(self) -> int:
        return self.window - (len(self.sent) - self.acked)

    def send(self, delivery: Delivery) -> None:
        if self.closed:
            raise DeliveryError("closed", endpoint="test", kind=FailureKind.TRANSIENT)
        self.sent.append(delivery)


def test_in_memory_hub_satisfies_the_hub_protocol() -> None:
    hub: Hub = InMemoryHub()
    assert hub is not None


async def test_ingest_answers_per_message_in_order_with_refusals() -> None:
    hub = InMemoryHub()
    hub.refuse(RefusalReason.QUOTA_EXCEEDED)
    outcomes = await hub.ingest(MOD, [Message(b"1"), Message(b"2")])
    assert outcomes == [Rejected(RefusalReason.QUOTA_EXCEEDED), Stored("1")]
    assert [m.body for _, m in hub.stored] == [b"2"]
    assert hub.stored[0][1].edge_message_id == "1"


async def test_held_ingest_waits_for_release() -> None:
    hub = InMemoryHub()
    hub.hold()
    task = asyncio.create_task(hub.ingest(MOD, [Message(b"x")]))
    async with asyncio.timeout(5):
        await hub.wait_held(1)
    assert not task.done()
    hub.release()
    async with asyncio.timeout(5):
        assert await task == [Stored("1")]


async def test_sas_login_follows_the_clock() -> None:
    clock = ManualClock(start=1_000)
    hub = InMemoryHub(host_name="h", clock=clock)
    hub.add_identity(MOD, key_b64=KEY)
    token = generate_sas_token("h/devices/d/modules/m", KEY, 1_100).encode()
    assert (await hub.authenticate(Credentials(MOD, password=token))).auth_method == "sas"
    clock.advance(100)
    with pytest.raises(AuthenticationError):
        await hub.authenticate(Credentials(MOD, password=token))


async def test_deliveries_respect_the_window_and_come_again_on_the_next_link() -> None:
    hub = InMemoryHub()
    first = Link(window=2)
    await hub.connect(MOD, first, clean_session=False)
    ids = [hub.enqueue(MOD, "in", Message(bytes([i]))) for i in range(3)]
    assert [d.delivery_id for d in first.sent] == ids[:2]
    first.acked += 1  # the client's PUBACK frees the window before the hub hears of it
    hub.delivered(MOD, ids[0], True)
    assert [d.delivery_id for d in first.sent] == ids[:2]  # delivered alone sends nothing
    hub.link_ready(MOD, first)
    assert [d.delivery_id for d in first.sent] == ids
    first.closed = True
    await hub.disconnect(MOD, first)
    second = Link(window=5)
    info = await hub.connect(MOD, second, clean_session=False)
    assert info.session_present
    assert [(d.delivery_id, d.redelivery) for d in second.sent] == [(ids[1], True), (ids[2], True)]


async def test_a_stale_link_disconnecting_does_not_unregister_the_new_one() -> None:
    hub = InMemoryHub()
    old, new = Link(4), Link(4)
    await hub.connect(MOD, old, clean_session=True)
    await hub.connect(MOD, new, clean_session=True)
    await hub.disconnect(MOD, old)
    hub.enqueue(MOD, "in", Message(b"x"))
    assert len(new.sent) == 1
    assert old.sent == []
