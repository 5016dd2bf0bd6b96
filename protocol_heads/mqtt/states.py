"""The MQTT server connection's state machine as one table: ``TRANSITIONS`` maps (state, trigger) to the next
state. ``ServerConnection`` moves only along it, for the client's packets and the server's actions alike.

Invariants: a (state, trigger) pair missing from the table is a protocol violation when the client caused it and
a ``LocalProtocolError`` when the server did; CLOSED is left by nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Final

from edgehub.mqtt.packets import (
    Auth,
    Connect,
    Disconnect,
    PingReq,
    PubAck,
    Publish,
    PubRel,
    Subscribe,
    Unsubscribe,
)

__all__ = ["ROWS", "TRANSITIONS", "TRIGGER_OF", "ConnectionState", "Trigger"]


class ConnectionState(Enum):
    AWAIT_CONNECT = "await_connect"
    AUTHENTICATING = "authenticating"  # CONNECT received; the server has not answered yet
    CONNECTED = "connected"
    CLOSED = "closed"

    # Members are singletons: identity hashing is right, and it is C's, where Enum's own hashes the name in Python
    # (the table is looked up for every packet).
    __hash__ = object.__hash__


class Trigger(Enum):
    """What moves the state machine: a packet from the client, or an action of the server."""

    CONNECT = "CONNECT"
    PUBLISH = "PUBLISH"
    PUBACK = "PUBACK"
    PUBREL = "PUBREL"
    SUBSCRIBE = "SUBSCRIBE"
    UNSUBSCRIBE = "UNSUBSCRIBE"
    PINGREQ = "PINGREQ"
    DISCONNECT = "DISCONNECT"
    AUTH = "AUTH"
    # Server actions.
    ACCEPT = "accept"
    REFUSE = "refuse"
    SETTLE = "settle"
    SEND_MESSAGE = "send_message"
    ANSWER_SUBSCRIPTION = "answer_subscription"
    CLOSE = "close"

    __hash__ = object.__hash__  # as ConnectionState's


_S = ConnectionState
_T = Trigger

# The one table: (state, trigger) → next state. A pair that is not here is a protocol violation when the client
# caused it, and a LocalProtocolError when the server did.
TRANSITIONS: Final[Mapping[ConnectionState, Mapping[Trigger, ConnectionState]]] = {
    _S.AWAIT_CONNECT: {
        _T.CONNECT: _S.AUTHENTICATING,
        _T.CLOSE: _S.CLOSED,
    },
    _S.AUTHENTICATING: {
        _T.ACCEPT: _S.CONNECTED,
        _T.REFUSE: _S.CLOSED,
        _T.CLOSE: _S.CLOSED,
    },
    _S.CONNECTED: {
        _T.PUBLISH: _S.CONNECTED,
        _T.PUBACK: _S.CONNECTED,
        _T.PUBREL: _S.CONNECTED,
        _T.SUBSCRIBE: _S.CONNECTED,
        _T.UNSUBSCRIBE: _S.CONNECTED,
        _T.PINGREQ: _S.CONNECTED,
        _T.AUTH: _S.CONNECTED,
        _T.DISCONNECT: _S.CLOSED,
        _T.SETTLE: _S.CONNECTED,
        _T.SEND_MESSAGE: _S.CONNECTED,
        _T.ANSWER_SUBSCRIPTION: _S.CONNECTED,
        _T.CLOSE: _S.CLOSED,
    },
    # Settling after close is allowed and does nothing: the hub may finish a write after the client left.
    _S.CLOSED: {_T.SETTLE: _S.CLOSED, _T.CLOSE: _S.CLOSED},
}

# The packets a client sends, each with the trigger it is; any other packet from a client is a protocol violation.
TRIGGER_OF: Final[Mapping[type, Trigger]] = {
    Connect: _T.CONNECT,
    Publish: _T.PUBLISH,
    PubAck: _T.PUBACK,
    PubRel: _T.PUBREL,
    Subscribe: _T.SUBSCRIBE,
    Unsubscribe: _T.UNSUBSCRIBE,
    PingReq: _T.PINGREQ,
    Disconnect: _T.DISCONNECT,
    Auth: _T.AUTH,
}


# TRANSITIONS again, each state's row keyed by trigger and also by the class of each packet a client sends: a
# packet's next state is then one look-up by its type. Derived here, never written by hand.
def _row(row: Mapping[Trigger, ConnectionState]) -> dict[object, ConnectionState]:
    keyed: dict[object, ConnectionState] = {}
    keyed.update(row.items())
    keyed.update((cls, row[trigger]) for cls, trigger in TRIGGER_OF.items() if trigger in row)
    return keyed


ROWS: Final[Mapping[ConnectionState, Mapping[object, ConnectionState]]] = {
    state: _row(row) for state, row in TRANSITIONS.items()
}
