"""MQTT and AMQP over WebSockets, as IoT Hub serves them (path ``/$iothub/websocket``, subprotocols ``mqtt`` and
``AMQPWSB10``): one listener (``WebSocketServer``) whose connections, once upgraded, are handed to the MQTT or the
AMQP head as the byte stream that head already reads from a TCP socket. The heads' protocol code never learns
that a WebSocket carries it: ``WebSocketStream`` is an ``asyncio.Transport`` to the head (its one hook is
``HeadServer.adopt``) and the real socket's protocol underneath, with wsproto doing the framing.

A connection's life: accepted and counted (``SocketSide``: the WebSocket listener's own pre-login caps), the TLS
handshake, the HTTP upgrade request (``UpgradeSocket``), then the head's socket side on a ``WebSocketStream``,
counted again under that head's caps as any connection of its own, with its own login timeout and keepalive. Both
live in ``websocket_stream``, which (and wsproto with it) is loaded at the first accepted connection.

Invariants:
* Everything a client sends is bounded: the upgrade request (``max_upgrade_request_bytes``, and the time from
  accept to its end, ``connect_timeout_s``, TLS included), each frame (``max_frame_bytes``), each message and its
  fragments (``max_message_bytes``, ``max_message_frames``). A frame's payload is never held whole: wsproto hands
  it on as it arrives and it goes to the head at once, so what a connection holds is one read, whatever the
  frame's announced length. Past a bound: an HTTP status before the upgrade (400, 404, 408, 431), a WebSocket
  close after it (1003, 1009, 1002 for bad framing), and one refusal line through the listener's ``RefusalLog``.
* The head's pauses are the socket's: when the head pauses reading, the socket is paused and no decoded byte is
  handed on until it resumes; when the socket's write buffer is full, the head is told (``pause_writing``).
* No extension is accepted (permessage-deflate would make a small frame a large one), and text frames are
  refused: both subprotocols are binary.
* Once handed over, the connection belongs to the head: its caps, its login timeout, its keepalive; its place
  under the WebSocket listener's total cap is given back when the socket is closed.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from edgehub.hub import Hub, LoginThrottle
from protocol_heads.limits import HeadSettings
from protocol_heads.listeners import HeadServer

if TYPE_CHECKING:
    from protocol_heads.websocket_stream import UpgradeSocket

__all__ = ["IOTHUB_PATH", "SUBPROTOCOL_AMQP", "SUBPROTOCOL_MQTT", "WebSocketServer", "WebSocketSettings"]

log = logging.getLogger(__name__)

IOTHUB_PATH = "/$iothub/websocket"  # IoT Hub's, for both protocols; a query string after it is ignored
SUBPROTOCOL_MQTT = "mqtt"
SUBPROTOCOL_AMQP = "AMQPWSB10"  # AMQP 1.0 over WebSockets, binary (OASIS AMQP WebSocket Binding)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebSocketSettings(HeadSettings):
    """The WebSocket listener's settings: ``HeadSettings``' (``tcp_port``: ws://, ``tls_port``: wss://, each off
    unless given; the caps and ``connect_timeout_s`` count from accept to the end of the upgrade request), and:

    * ``path``: the request path served (a query string after it is ignored); another is refused with 404.
    * ``max_upgrade_request_bytes``: the most the upgrade request may take, headers included; over it: 431.
    * ``max_frame_bytes``: the largest frame taken; over it: close 1009 (message too big).
    * ``max_message_bytes``: the largest message (all its fragments); over it: close 1009.
    * ``max_message_frames``: the most fragments of one message (empty ones count); over it: close 1009.
    """

    positive_fields: ClassVar[tuple[str, ...]] = (
        *HeadSettings.positive_fields,
        "max_upgrade_request_bytes",
        "max_frame_bytes",
        "max_message_bytes",
        "max_message_frames",
    )

    path: str = IOTHUB_PATH
    max_upgrade_request_bytes: int = 8 * 1024
    # A frame and a message carry the head's packets (the MQTT head's largest: 257 KiB; an AMQP transfer's:
    # 64 KiB frames), whole or in pieces, so these bound framing abuse, not what the head takes.
    max_frame_bytes: int = 4 * 1024 * 1024
    max_message_bytes: int = 4 * 1024 * 1024
    max_message_frames: int = 1024

    def __post_init__(self) -> None:
        HeadSettings.__post_init__(self)  # not super(): a slotted dataclass is a new class, its __class__ cell stale
        if not self.path.startswith("/"):
            raise ValueError(f"path must start with '/', not {self.path!r}")


class _NoSession:
    """The WebSocket listener logs no client in (the head it hands a connection to does): it has no sessions."""

    def revoke(self) -> None:  # pragma: no cover - never registered
        raise NotImplementedError


class WebSocketServer(HeadServer[WebSocketSettings, _NoSession]):
    """``async with WebSocketServer(hub, settings=..., heads={"mqtt": mqtt, "AMQPWSB10": amqp}) as ws:`` listens
    until the block ends; ``ws.ports`` maps ``"ws"``/``"wss"`` to the bound ports. ``heads`` maps each
    subprotocol served to the head a connection asking for it is handed to (a subprotocol left out: refused)."""

    protocol = "ws"
    port_names = ("ws", "wss")
    log = log

    def __init__(
        self,
        hub: Hub,
        *,
        settings: WebSocketSettings,
        heads: Mapping[str, HeadServer[Any, Any]],
        logins: LoginThrottle | None = None,
    ) -> None:
        super().__init__(hub, settings=settings, logins=logins)
        self.heads = dict(heads)

    def _socket(self, tls: ssl.SSLContext | None) -> UpgradeSocket:
        # wsproto (about 1.2 MB of RSS) is loaded at the first accepted connection, here and nowhere else: a hub
        # whose WebSocket listener nobody uses does not hold it (the AMQP head waits for proton so too).
        from protocol_heads.websocket_stream import UpgradeSocket

        return UpgradeSocket(self, tls)
