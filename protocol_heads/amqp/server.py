"""The asyncio adapter of the AMQP head: the listeners, and one connection (a socket side and a session side)
and one task per client, all in the server's ``TaskGroup`` (``HeadServer``, ``protocol_heads.listeners``, which
the MQTT head's server shares).

Invariants: ``HeadServer``'s (named client tasks that never cancel the server, bounded admission and login
throttles, one ``RefusalLog`` on this module's logger, one live connection per identity: a new login takes over).

python-qpid-proton (the engine under ``client_socket`` and ``session``: about 4 MB of RSS with its library) is
imported at the first accepted connection, in ``_socket`` and nowhere else: listening needs only a socket, and a
hub that serves AMQP but has no AMQP device connected does not hold it. That first accept pays the import once on
the event loop (about 35 ms on x86-64 at a load of 5; several times that on a Pi Zero's Cortex-A53), which every
other client waits out once. Whether proton is installed is checked when the server starts (``__aenter__``), so
a missing engine stops the start with its reason (a ``ConfigurationError``) rather than failing the first AMQP
client.
"""

from __future__ import annotations

import importlib.util
import logging
import ssl
from typing import TYPE_CHECKING, Self

from edgehub.core import ConfigurationError
from protocol_heads.amqp.settings import AmqpSettings
from protocol_heads.listeners import HeadServer

if TYPE_CHECKING:
    from protocol_heads.amqp.client_socket import ClientSocket
    from protocol_heads.amqp.session import Session  # noqa: F401 (named in a string: a base is evaluated at run time)

__all__ = ["AmqpServer", "AmqpSettings"]

_ENGINE = ("proton", "cproton")  # python-qpid-proton's modules (its PyPI name differs)


class AmqpServer(HeadServer[AmqpSettings, "Session"]):
    """``async with AmqpServer(hub, settings=...) as server:`` listens until the block ends (``HeadServer``)."""

    protocol = "amqp"
    port_names = ("amqp", "amqps")  # AMQP's URL schemes
    log = logging.getLogger(__name__)

    async def __aenter__(self) -> Self:
        # find_spec looks the engine up without loading it (the module docstring says why it waits).
        missing = [name for name in _ENGINE if importlib.util.find_spec(name) is None]
        if missing:
            raise ConfigurationError(
                f"the AMQP head needs python-qpid-proton (missing: {', '.join(missing)}); "
                "install it or serve without AMQP (edgehub run --no-amqp)"
            )
        return await super().__aenter__()

    def _socket(self, tls: ssl.SSLContext | None) -> ClientSocket:
        # The one place proton is loaded: at the first accepted connection, once (the module docstring says why).
        from protocol_heads.amqp.client_socket import ClientSocket

        return ClientSocket(self, tls)
