"""The one way the tests build a foreign AMQP sender: the pure-Python AMQP stack inside Azure's ``azure-eventhub``
(``_pyamqp``), logging in with a SAS token put on ``$cbs`` as the Azure SDKs do, over TLS or over a WebSocket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from azure.eventhub._pyamqp.authentication import AccessToken, JWTTokenAuth
from azure.eventhub._pyamqp.client import SendClient
from azure.eventhub._pyamqp.constants import TransportType

from protocol_heads.websocket import IOTHUB_PATH

FAR_EXPIRY = 4_000_000_000  # seconds since the epoch: a token that outlives any test


def pyamqp_sender(
    port: int,
    ca_pem: Path,
    token: str,
    *,
    host_name: str,
    device_id: str,
    websocket: bool = False,
    expires_on: int = FAR_EXPIRY,
) -> Any:
    """A ``_pyamqp`` sender of ``device_id``'s telemetry to localhost:``port``: amqps, or wss on the IoT Hub path;
    ``token`` (valid until ``expires_on``) is put on ``$cbs`` for the resource ``host_name/devices/device_id``."""
    resource = f"{host_name}/devices/{device_id}"
    auth = JWTTokenAuth(
        f"amqps://{resource}",
        resource,
        lambda *_args, **_kwargs: AccessToken(token, expires_on),
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
        f"/devices/{device_id}/messages/events",
        auth=auth,
        connection_verify=str(ca_pem),
        socket_timeout=5.0,
        **transport,
    )
