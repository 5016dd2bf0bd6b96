"""The stamps the hub puts on every message on its way in (``edgehub.hub.stamps``): ids unique per start and
prefix, times held to ``isoformat``, one copy per message, a forged module id dropped."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from edgehub.core import Message, SystemProperty, utc_from_epoch
from edgehub.hub.stamps import Stamper
from edgehub.testing import ManualClock

STAMPER = Stamper(ManualClock())


@given(st.floats(min_value=0, max_value=2**32, allow_nan=False, allow_infinity=False))
@example(0.0)
@example(1_700_000_000.0)
@example(1_700_000_000.9999995)  # rounds up into the next second
@example(1_700_000_000.0000005)
def test_stamped_enqueued_time_reads_exactly_as_isoformat(epoch_s: float) -> None:
    assert STAMPER.iso_utc(epoch_s) == utc_from_epoch(epoch_s).isoformat()


def test_stamped_edge_message_ids_are_distinct_and_share_one_random_prefix_per_start() -> None:
    stamper = Stamper(ManualClock())
    ids = [m.edge_message_id for m in stamper.stamp_group([Message(body=b"x")] * 5000, {})]
    ids += [m.edge_message_id for m in stamper.stamp_group([Message(body=b"y")] * 3, {})]
    assert len(set(ids)) == len(ids) == 5003
    assert all(text is not None and len(text) == 32 and int(text, 16) >= 0 for text in ids)
    assert len({text[:16] for text in ids if text}) == 1  # one prefix per start
    assert [int(text[16:], 16) for text in ids if text] == list(range(5003))  # then a counter, group after group
    # another start (a new stamper) draws another prefix: ids stay unique per hub across restarts
    other = Stamper(ManualClock()).edge_message_ids(1)[0]
    assert other[:16] != ids[0][:16]  # type: ignore[index]


def test_stamps_already_present_are_kept() -> None:
    sp: dict[str, str] = {SystemProperty.EDGE_MESSAGE_ID: "mine", SystemProperty.ENQUEUED_TIME: "then"}
    message = Message(body=b"x", system_properties=sp)
    [stamped] = STAMPER.stamp_group([message], {"connectionDeviceId": "d1"})
    assert stamped.system_properties == {**sp, "connectionDeviceId": "d1"}


def test_stamp_group_gives_each_message_its_own_id_one_enqueued_time_and_the_updates() -> None:
    forged = Message(b"f", system_properties={"connectionModuleId": "forged", "messageId": "x"})
    kept = Message(b"k", system_properties={"edgeMessageId": "e1", "enqueuedTime": "then"})
    out = STAMPER.stamp_group([forged, kept, Message(b"0")], {"connectionDeviceId": "d1"}, drop="connectionModuleId")
    assert [o.body for o in out] == [b"f", b"k", Message(b"0").body]
    assert "connectionModuleId" not in out[0].system_properties
    assert out[0].source == "/messages"  # derived from the stamped properties, not the forged ones
    assert all(o.system_properties["connectionDeviceId"] == "d1" for o in out)
    assert out[1].system_properties["edgeMessageId"] == "e1"
    assert out[1].system_properties["enqueuedTime"] == "then"
    assert out[0].system_properties["edgeMessageId"] != out[2].system_properties["edgeMessageId"]
    assert out[0].system_properties["enqueuedTime"] == out[2].system_properties["enqueuedTime"]
    assert forged.system_properties["connectionModuleId"] == "forged"  # the originals are untouched
