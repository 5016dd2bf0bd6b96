"""Drives the Azure IoT device SDK for Python (``azure-iot-device``) for one interop scenario.

It runs under the SDK's own venv (``.venv-azure-sdk``: the SDK pins ``paho-mqtt<2``, the project uses 2.x), so
it imports nothing from edgehub. Usage::

    .venv-azure-sdk/bin/python azure_sdk_driver.py SCENARIO SPEC_JSON

SPEC_JSON always has ``connection_string`` (an IoT Hub style one with ``GatewayHostName``: the SDK dials that
name on port 8883 over TLS) and ``ca`` (the PEM file the SDK trusts, as ``server_verification_cert``), and
``timeout_s``; with ``proxy`` (``[host, port]``) it connects through that HTTP proxy; with ``websockets`` true it
speaks MQTT over a WebSocket (port 443, path ``/$iothub/websocket``: the SDK's ``websockets=True``). Scenarios:

* ``send``: connect, then send each of ``messages`` (``data``, ``message_id``, ``correlation_id``, ``user_id``,
  ``content_type``, ``content_encoding``, ``custom_properties``, ``security``: mark it a security message), to
  the output ``output`` when given (module clients), else as device telemetry. ``send_message`` returns when
  the SDK has its PUBACK; one ``{"event": "sent", "index": i}`` line follows each.
* ``receive``: connect, install the input message handler (the SDK subscribes then), print
  ``{"event": "ready"}``, then one ``{"event": "message", ...}`` line per message received, until ``count``.
* ``methods``: connect, install the method request handler (the SDK subscribes then), print ``{"event":
  "ready"}``, then for each of ``count`` calls print ``{"event": "method", "name", "payload"}`` and answer it
  with ``status`` and the payload ``{"answer": <name>, "request": <its payload>}``.
  A device client's ``receive`` gets cloud-to-device messages (``input_name`` null).
* ``twin``: connect, install the desired-properties patch handler (the SDK subscribes then), print
  ``{"event": "twin", "desired": ..., "reported": ...}`` from ``get_twin``; with ``report``, patch the reported
  properties with it and print ``{"event": "reported"}``; print ``{"event": "ready"}``, then one
  ``{"event": "patch", "patch": ...}`` line per desired patch received, until ``patches``.
* ``connect``: connect and disconnect.

Every line on stdout is one JSON object. A failure prints ``{"event": "error", "type": <SDK exception class>,
"detail": ...}`` and exits 1; nothing waits longer than ``timeout_s``.
"""

from __future__ import annotations

import json
import queue
import sys
from typing import Any

from azure.iot.device import IoTHubDeviceClient, IoTHubModuleClient, Message, MethodResponse, ProxyOptions


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def make_client(spec: dict[str, Any]) -> Any:
    with open(spec["ca"]) as f:
        ca = f.read()
    cls = IoTHubModuleClient if ";ModuleId=" in spec["connection_string"] else IoTHubDeviceClient
    # Through an HTTP proxy as the SDK's users behind one set it, when the spec names one (the SDK dials 8883
    # only, and the proxy tunnels that to the hub's real port).
    proxy = ProxyOptions("HTTP", spec["proxy"][0], spec["proxy"][1]) if spec.get("proxy") else None
    # No retries behind the test's back: a refused connect must come back as the error it is.
    return cls.create_from_connection_string(
        spec["connection_string"],
        server_verification_cert=ca,
        connection_retry=False,
        keep_alive=30,
        proxy_options=proxy,
        websockets=bool(spec.get("websockets")),
    )


def outgoing(m: dict[str, Any]) -> Any:
    msg = Message(
        m["data"],
        message_id=m.get("message_id"),
        content_encoding=m.get("content_encoding"),
        content_type=m.get("content_type"),
    )
    msg.correlation_id = m.get("correlation_id")
    msg.user_id = m.get("user_id")
    msg.custom_properties = dict(m.get("custom_properties", {}))
    if m.get("security"):
        msg.set_as_security_message()
    return msg


def incoming(msg: Any) -> dict[str, Any]:
    data = msg.data
    return {
        "input_name": msg.input_name,
        "data": data.decode("utf-8") if isinstance(data, bytes) else data,
        "message_id": msg.message_id,
        "correlation_id": msg.correlation_id,
        "user_id": msg.user_id,
        "content_type": msg.content_type,
        "content_encoding": msg.content_encoding,
        "custom_properties": msg.custom_properties,
    }


def send(client: Any, spec: dict[str, Any]) -> None:
    client.connect()
    output = spec.get("output")
    for i, m in enumerate(spec["messages"]):
        if output is None:
            client.send_message(outgoing(m))
        else:
            client.send_message_to_output(outgoing(m), output)
        emit("sent", index=i)


def receive(client: Any, spec: dict[str, Any]) -> None:
    got: queue.Queue[Any] = queue.Queue()
    client.connect()
    client.on_message_received = got.put  # returns once the SDK's SUBSCRIBE to its inputs is acknowledged
    emit("ready")
    for _ in range(spec["count"]):
        try:
            msg = got.get(timeout=spec["timeout_s"])
        except queue.Empty:
            emit("error", type="Timeout", detail=f"no message within {spec['timeout_s']} s")
            raise SystemExit(1) from None
        emit("message", **incoming(msg))


def methods(client: Any, spec: dict[str, Any]) -> None:
    got: queue.Queue[Any] = queue.Queue()
    client.connect()
    client.on_method_request_received = got.put  # returns once the SDK's SUBSCRIBE to its methods is acknowledged
    emit("ready")
    for _ in range(spec["count"]):
        try:
            request = got.get(timeout=spec["timeout_s"])
        except queue.Empty:
            emit("error", type="Timeout", detail=f"no method call within {spec['timeout_s']} s")
            raise SystemExit(1) from None
        emit("method", name=request.name, payload=request.payload)
        answer = {"answer": request.name, "request": request.payload}
        client.send_method_response(MethodResponse.create_from_method_request(request, spec["status"], answer))


def twin(client: Any, spec: dict[str, Any]) -> None:
    patches: queue.Queue[Any] = queue.Queue()
    client.connect()
    client.on_twin_desired_properties_patch_received = patches.put  # returns once the SUBSCRIBE is acknowledged
    doc = client.get_twin()
    emit("twin", desired=doc["desired"], reported=doc["reported"])
    if spec.get("report") is not None:
        client.patch_twin_reported_properties(spec["report"])
        emit("reported")
    emit("ready")
    for _ in range(spec.get("patches", 0)):
        try:
            patch = patches.get(timeout=spec["timeout_s"])
        except queue.Empty:
            emit("error", type="Timeout", detail=f"no desired patch within {spec['timeout_s']} s")
            raise SystemExit(1) from None
        emit("patch", patch=patch)


def main(argv: list[str]) -> int:
    scenario, spec = argv[1], json.loads(argv[2])
    client = make_client(spec)
    try:
        if scenario == "send":
            send(client, spec)
        elif scenario == "receive":
            receive(client, spec)
        elif scenario == "methods":
            methods(client, spec)
        elif scenario == "twin":
            twin(client, spec)
        elif scenario == "connect":
            client.connect()
        else:
            raise SystemExit(f"unknown scenario {scenario!r}")
        client.disconnect()
    except Exception as exc:
        emit("error", type=type(exc).__name__, detail=str(exc))
        return 1
    finally:
        client.shutdown()
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
