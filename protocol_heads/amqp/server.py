"""The asyncio adapter of the AMQP head: the listeners, and one connection (a socket side and a session side)
and one task per client, all in the server's ``TaskGroup`` (``HeadServer``, ``protocol_heads.listeners``, which
the MQTT head's server shares).

Invariants: ``HeadServer``'s (named client tasks that never cancel the server, bounded admission and login
throttles, one ``RefusalLog`` on this module's logger, one live connection per identity: a new login takes over).
"""

from __future__ import annotations

import logging
import ssl

from protocol_heads.amqp.client_socket import ClientSocket
from protocol_heads.amqp.session import Session
from protocol_heads.amqp.settings import AmqpSettings
from protocol_heads.listeners import HeadServer

__all__ = ["AmqpServer", "AmqpSettings"]


class AmqpServer(HeadServer[AmqpSettings, Session]):
    """``async with AmqpServer(hub, settings=...) as server:`` listens until the block ends (``HeadServer``)."""

    protocol = "amqp"
    port_names = ("amqp", "amqps")  # AMQP's URL schemes
    log = logging.getLogger(__name__)

    def _socket(self, tls: ssl.SSLContext | None) -> ClientSocket:
        return ClientSocket(self, tls)
