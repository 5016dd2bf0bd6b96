"""The state machine of one (endpoint, priority) queue, as one transition table (after h11).

::

    IDLE --batch--> SENDING --sent_ok--> CHECKPOINTING --committed--> IDLE
                     |  sent_failed                                     ^
                     v                                                  |
                   FAILING --retry_due / reachable--> SENDING           |
                     |  give_up (nothing left to retry) --> CHECKPOINTING
    any state --close--> CLOSED

A FAILING queue holds the rest of its failed batch until its retry is due (or the endpoint reports it is
reachable); the executor's pump serves other queues meanwhile. ``give_up``: every message of that batch was
dead-lettered, expired or removed from the store. ``DEAD`` is a queue that has been failing longer than its
unhealthy threshold; it is still retried, and leaves like FAILING does.
A transition not in the table raises ``InvalidTransition``: a bug, never a condition to handle.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TRANSITIONS", "Event", "InvalidTransition", "State", "next_state"]


class State(StrEnum):
    IDLE = "idle"
    SENDING = "sending"
    CHECKPOINTING = "checkpointing"
    FAILING = "failing"
    DEAD = "dead"
    CLOSED = "closed"


class Event(StrEnum):
    BATCH = "batch"
    SENT_OK = "sent_ok"
    SENT_FAILED = "sent_failed"
    COMMITTED = "committed"
    RETRY_DUE = "retry_due"
    REACHABLE = "reachable"
    GIVE_UP = "give_up"
    UNHEALTHY = "unhealthy"
    CLOSE = "close"


class InvalidTransition(ValueError):
    def __init__(self, state: State, event: Event) -> None:
        super().__init__(f"no transition from {state} on {event}")
        self.state = state
        self.event = event


TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.IDLE, Event.BATCH): State.SENDING,
    (State.SENDING, Event.SENT_OK): State.CHECKPOINTING,
    (State.SENDING, Event.SENT_FAILED): State.FAILING,
    (State.FAILING, Event.RETRY_DUE): State.SENDING,
    (State.FAILING, Event.REACHABLE): State.SENDING,
    (State.FAILING, Event.GIVE_UP): State.CHECKPOINTING,
    (State.FAILING, Event.UNHEALTHY): State.DEAD,
    (State.DEAD, Event.REACHABLE): State.SENDING,
    (State.DEAD, Event.RETRY_DUE): State.SENDING,
    (State.DEAD, Event.GIVE_UP): State.CHECKPOINTING,
    (State.CHECKPOINTING, Event.COMMITTED): State.IDLE,
    **{(s, Event.CLOSE): State.CLOSED for s in State},
}


def next_state(state: State, event: Event) -> State:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(state, event) from None
