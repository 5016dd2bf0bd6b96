"""The ack slots of one connection's inbound QoS 1 and 2 messages: which ack may go out next.

Invariants:
* Tickets are handed out in arrival order and never reused on a connection.
* A slot becomes due only when it and every older slot are settled: acks leave in arrival order, whatever order
  the hub settles them in.
* A ticket is settled at most once; at most ``limit`` slots are open (the Receive Maximum the server announced).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import msgspec

from edgehub.core import LocalProtocolError
from edgehub.mqtt.packets import ProtocolViolation, ReasonCode

__all__ = ["AckQueue", "AckSlot"]


class AckSlot(msgspec.Struct, gc=False):
    """One inbound message's ack, open until ``reason`` is set (mutable; only ints and strings in it)."""

    ticket: int
    qos: int
    packet_id: int
    reason: int | None = None
    text: str | None = None  # MQTT 5 Reason String of a refusal


class AckQueue:
    """Open ack slots in arrival order, by ticket."""

    __slots__ = ("_next_ticket", "_order", "_slots", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._order: deque[AckSlot] = deque()
        self._slots: dict[int, AckSlot] = {}
        self._next_ticket = 1

    def __len__(self) -> int:
        return len(self._order)

    def open(self, qos: int, packet_id: int) -> int:
        """A slot for a message that just arrived; its ticket. Over ``limit`` open slots: 0x93."""
        if len(self._order) >= self.limit:
            raise ProtocolViolation(
                "more unacknowledged messages than Receive Maximum", reason_code=ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
            )
        ticket = self._next_ticket
        self._next_ticket += 1
        slot = AckSlot(ticket, qos, packet_id)
        self._order.append(slot)
        self._slots[ticket] = slot
        return ticket

    def settle(self, answers: Iterable[tuple[int, int, str | None]], *, closed: bool = False) -> None:
        """Set each ``(ticket, reason code, Reason String)`` answer (the string kept for a refusal only). A ticket
        with no slot (never opened, or its ack gone already) is a LocalProtocolError, unless the connection is
        ``closed``: then the rest is of no use and is dropped."""
        slots = self._slots
        for ticket, reason_code, text in answers:
            slot = slots.get(ticket)
            if slot is None:
                if closed:
                    return
                raise LocalProtocolError(f"unknown or already settled ticket {ticket}")
            if slot.reason is not None:
                raise LocalProtocolError(f"ticket {ticket} settled twice")
            slot.reason = reason_code
            slot.text = text if reason_code >= 0x80 else None

    def take_due(self) -> list[AckSlot]:
        """The settled slots at the head, oldest first, taken out: their acks may go out now."""
        order, slots = self._order, self._slots
        due: list[AckSlot] = []
        while order and order[0].reason is not None:
            head = order.popleft()
            del slots[head.ticket]
            due.append(head)
        return due
