"""The asyncio adapter of the MQTT head: the listeners, and one connection (a socket side and a session side)
and one task per client, all in the server's ``TaskGroup`` (``HeadServer``, ``protocol_heads.listeners``, which
the AMQP head's server shares).

It only moves bytes between sockets and ``ServerConnection``, runs the timers and asks the hub; the protocol lives
in ``connection.py``, a connection's socket in ``client_socket.py``, what the client is to the hub in
``session.py``, and the IoT Hub conventions in ``iothub.py``.

Invariants (beside ``HeadServer``'s: named client tasks that never cancel the server, bounded admission and
login throttles, one ``RefusalLog`` on this module's logger, one live session per identity):
* Every connection reads into the server's one read buffer, handed to each ``ClientSocket`` (``client_socket``
  says why that is safe).
* ``close_identity`` (``HeadServer``'s) ends an identity's session when its credentials are removed or rotated
  (the admin API): an MQTT 5 client gets DISCONNECT 0x98 (administrative action), and no will is published.
"""

from __future__ import annotations

import logging
import ssl

from edgehub.hub import Hub, LoginThrottle
from protocol_heads.listeners import HeadServer
from protocol_heads.mqtt.client_socket import READ_SIZE, ClientSocket
from protocol_heads.mqtt.session import Session
from protocol_heads.mqtt.settings import MqttSettings, connection_cap

__all__ = ["MqttServer", "MqttSettings", "connection_cap"]


class MqttServer(HeadServer[MqttSettings, Session]):
    """``async with MqttServer(hub, settings=...) as server:`` listens until the block ends.
    ``server.ports`` maps ``"tcp"``/``"tls"`` to the bound port numbers."""

    protocol = "mqtt"
    port_names = ("tcp", "tls")
    log = logging.getLogger(__name__)

    def __init__(self, hub: Hub, *, settings: MqttSettings, logins: LoginThrottle | None = None) -> None:
        super().__init__(hub, settings=settings, logins=logins)
        self._read_buffer = memoryview(bytearray(READ_SIZE))  # every connection reads into it (see above)

    def _socket(self, tls: ssl.SSLContext | None) -> ClientSocket:
        return ClientSocket(self, tls, self._read_buffer)
