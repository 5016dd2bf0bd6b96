"""The hub's stamps on a message on its way in, made in one copy per message: the identity the connection
authenticated as (``connectionDeviceId``, ``connectionModuleId``, ``connectionAuthMethod``: the hub's authority,
not the head's), ``edgeMessageId`` (32 hex digits: a random 64-bit prefix drawn when the stamper is made, at
each start of the hub, then a 64-bit counter) and ``enqueuedTime`` (ISO 8601 UTC, as ``datetime.isoformat``
writes it). The hub facade is their one owner; the store stamps
nothing (it leaves the last two out of the sizes it charges: ``edgehub.store.records.charged_size``).

An ``edgeMessageId`` is unique per hub (a new random prefix at every start: two starts share one with a chance of
2^-64) and nothing more is promised of it (the Spark job deduplicates by hub and id). Ids of one start share their
first 16 to 28 digits, so a segment of them compresses: a random id per message (a UUID, as before) was about a
third of a small message's wire bytes under zstd with a trained dictionary, its 16 random bytes left as they are.

Invariants: an ``edgeMessageId`` or ``enqueuedTime`` already on a message is kept; the identity stamps replace
whatever the message carried, and a ``drop`` property (a device's forged ``connectionModuleId``) goes.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence

from edgehub.core import Clock, Message, SystemProperty, utc_from_epoch

__all__ = ["Stamper"]

# Plain strings: an enum member look-up per message is measurable on the ingest path.
_EDGE_MESSAGE_ID: str = SystemProperty.EDGE_MESSAGE_ID.value
_ENQUEUED_TIME: str = SystemProperty.ENQUEUED_TIME.value


class Stamper:
    """Makes the stamps, cheaply (``uuid.uuid4`` builds a UUID object, ``datetime.isoformat`` a datetime), and
    puts them on messages; times come from ``clock``.

    ``edge_message_ids(n)``: this stamper's random prefix and the next ``n`` values of its counter.
    ``iso_utc(t)``: exactly ``datetime.fromtimestamp(t, UTC).isoformat()`` (same rounding: half to even on the
    microsecond), with the date and time of day formatted once per second."""

    __slots__ = ("_clock", "_next", "_prefix", "_second", "_second_text")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._prefix = secrets.token_hex(8)  # 16 hex digits, drawn once per start
        self._next = 0
        self._second = math.nan
        self._second_text = ""

    def edge_message_ids(self, n: int) -> list[str]:
        """``n`` fresh ids (a group's, in one call: not a call per message)."""
        first, prefix = self._next, self._prefix
        self._next = first + n
        return [f"{prefix}{i:016x}" for i in range(first, first + n)]

    def iso_utc(self, epoch_s: float) -> str:
        frac, whole = math.modf(epoch_s)
        us = round(frac * 1e6)
        if us >= 1_000_000:
            whole, us = whole + 1.0, us - 1_000_000
        elif us < 0:
            whole, us = whole - 1.0, us + 1_000_000
        if whole != self._second:
            self._second_text = utc_from_epoch(whole).isoformat()[:-6]  # whole seconds: no fraction; drop +00:00
            self._second = whole
        return f"{self._second_text}.{us:06d}+00:00" if us else f"{self._second_text}+00:00"

    def stamp_group(
        self, messages: Sequence[Message], updates: Mapping[str, str], *, drop: str | None = None
    ) -> list[Message]:
        """Messages that arrived together (one read of a connection, or one), stamped: one copy per message,
        with ``updates`` set (after removing ``drop``), a fresh ``edgeMessageId`` each, and one
        ``enqueuedTime`` (the clock, read once) for all that lack them."""
        enqueued = self.iso_utc(self._clock.time())
        ids = self.edge_message_ids(len(messages))  # one each, whether it is used or not: random bytes are cheap
        out: list[Message] = []
        for message, new_id in zip(messages, ids, strict=True):
            sp = message.system_properties
            stamped = dict(sp)
            if drop is not None:
                stamped.pop(drop, None)
            stamped.update(updates)
            if _EDGE_MESSAGE_ID not in sp:
                stamped[_EDGE_MESSAGE_ID] = new_id
            if _ENQUEUED_TIME not in sp:
                stamped[_ENQUEUED_TIME] = enqueued
            out.append(Message(message.body, message.properties, stamped))
        return out
