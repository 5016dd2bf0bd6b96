from __future__ import annotations

import pytest

from edgehub.delivery import TRANSITIONS, Event, InvalidTransition, State, next_state


@pytest.mark.parametrize(
    ("state", "event", "expected"),
    [
        (State.IDLE, Event.BATCH, State.SENDING),
        (State.SENDING, Event.SENT_OK, State.CHECKPOINTING),
        (State.SENDING, Event.SENT_FAILED, State.FAILING),
        (State.FAILING, Event.RETRY_DUE, State.SENDING),
        (State.FAILING, Event.REACHABLE, State.SENDING),
        (State.FAILING, Event.GIVE_UP, State.CHECKPOINTING),
        (State.FAILING, Event.UNHEALTHY, State.DEAD),
        (State.DEAD, Event.REACHABLE, State.SENDING),
        (State.CHECKPOINTING, Event.COMMITTED, State.IDLE),
    ],
)
def test_transition_table_moves_as_drawn(state: State, event: Event, expected: State) -> None:
    assert next_state(state, event) is expected


@pytest.mark.parametrize("state", list(State))
def test_every_state_closes(state: State) -> None:
    assert next_state(state, Event.CLOSE) is State.CLOSED


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (State.IDLE, Event.SENT_OK),
        (State.SENDING, Event.BATCH),
        (State.CLOSED, Event.BATCH),
        (State.IDLE, Event.GIVE_UP),
    ],
)
def test_transition_not_in_table_is_refused(state: State, event: Event) -> None:
    with pytest.raises(InvalidTransition, match=f"from {state} on {event}"):
        next_state(state, event)


def test_closed_is_terminal() -> None:
    assert {e for (s, e) in TRANSITIONS if s is State.CLOSED} == {Event.CLOSE}
