"""Every public name of the MQTT head's modules, and of the codec it shares, is in its ``__all__`` (and every
name there exists)."""

from __future__ import annotations

import types

import pytest

import edgehub.hub
import edgehub.hub.connection_admission
import edgehub.hub.throttle
import edgehub.testing.hub
from edgehub.core import sas
from edgehub.mqtt import caches, client, decoder, encoder, fastpaths, packets
from protocol_heads import limits, listeners, socket_side, tls
from protocol_heads.mqtt import (
    acks,
    client_socket,
    connection,
    events,
    iothub,
    refusals,
    server,
    session,
    settings,
    states,
)


@pytest.mark.parametrize(
    "module",
    [
        acks,
        caches,
        client,
        client_socket,
        connection,
        decoder,
        encoder,
        events,
        fastpaths,
        iothub,
        packets,
        refusals,
        server,
        session,
        settings,
        states,
        sas,
        limits,
        listeners,
        socket_side,
        tls,
        edgehub.hub,
        edgehub.hub.connection_admission,
        edgehub.hub.throttle,
        edgehub.testing.hub,
    ],
)
def test_all_lists_exactly_the_public_names_defined_here(module: types.ModuleType) -> None:
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == module.__name__
    }
    exported = set(module.__all__)
    assert exported <= set(vars(module))
    assert public <= exported
