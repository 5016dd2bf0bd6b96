"""The AMQP head's fixtures (a real head on 127.0.0.1 port 0 over the in-memory hub), shared with its own tests,
and the one way these tests build a foreign sender: Azure's pure-Python ``_pyamqp``, logging in with a SAS token
on ``$cbs`` as the Azure SDKs do, over TLS or over a WebSocket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from azure.eventhub._pyamqp.authentication import AccessToken, JWTTokenAuth
from azure.eventhub._pyamqp.client import SendClient
from azure.eventhub._pyamqp.constants import TransportType

from protocol_heads.websocket import IOTHUB_PATH
from tests.protocol_heads.amqp.conftest import HOST, ca, head, hub

__all__ = ["ca", "head", "hub", "pyamqp_sender"]  # fixtures, used by name


def pyamqp_sender(port: int, ca_pem: Path, token: str, *, websocket: bool = False) -> Any:
    """A ``_pyamqp`` sender for dev1's telemetry on localhost:``port``: amqps, or wss on the IoT Hub path."""
    auth = JWTTokenAuth(
        f"amqps://{HOST}/devices/dev1",
        f"{HOST}/devices/dev1",
        lambda *_args, **_kwargs: AccessToken(token, 4_000_000_000),
        token_type=b"servicebus.windows.net:sastoken",
    )
    transport: dict[str, Any] = (
        {
            "transport_type": TransportType.AmqpOverWebsocket,
            "custom_endpoint_address": f"wss://localhost:{port}{IOTHUB_PATH}",
        }
        if websocket
        else {"custom_endpoint_address": f"amqps://localhost:{port}"}
    )
    return SendClient(  # type: ignore[no-untyped-call]
        "localhost",
        "/devices/dev1/messages/events",
        auth=auth,
        connection_verify=str(ca_pem),
        socket_timeout=5.0,
        **transport,
    )
