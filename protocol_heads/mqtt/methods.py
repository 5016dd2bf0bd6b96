"""Direct method calls a module makes over MQTT, to another module or a device behind the hub (as Azure IoT
Edge's hub relays them), on the same addressed topics the upstream's cloud side uses:

* the module publishes ``$iothub/{d}/methods/POST/{name}/?$rid={rid}[&$timeout={s}]`` (a device) or
  ``$iothub/{d}/{m}/methods/POST/{name}/?$rid=...`` (a module), the JSON payload as the body;
* the hub answers on ``$iothub/{d}[/{m}]/methods/res/{status}/?$rid={rid}`` with the target's status and payload,
  or IoT Hub's error (404 away, 504 silent, 400 malformed, 429 over a bound), if the caller subscribed to it
  (``$iothub/+/methods/res/#``, ``$iothub/+/+/methods/res/#``).

Invariants: only a module may call (a device cannot, as in IoT Hub): a device's call is refused; the PUBLISH is
acknowledged at once (a call is live, never stored); calls in progress per connection are bounded by the hub
(``edgehub.hub.methods.MethodLimits``), and the ones still waiting when the connection ends are cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from edgehub.core import Identity
from edgehub.core.methods import AddressedCall, MethodCall, MethodErrorCode, method_error
from edgehub.hub import Hub
from protocol_heads.mqtt.iothub import parse_method_response

__all__ = ["ModuleCalls", "answer_call"]

log = logging.getLogger(__name__)

_Respond = Callable[[str, bytes], None]  # sends (topic, payload) to the caller


def answer_call(hub: Hub, identity: Identity, topic: str, payload: bytes) -> bool:
    """Hand ``identity``'s answer on ``$iothub/methods/res/{status}/?$rid=`` to the hub; False when the topic is
    malformed or no call waits for it (the caller refuses the PUBLISH)."""
    answer = parse_method_response(topic)
    return answer is not None and hub.method_response(identity, answer[1], answer[0], payload)


class ModuleCalls:
    """The calls one connection has in progress. It holds nothing of the connection but these calls (whose
    ``respond`` sends the answer to the client), so a closed connection is freed once they are cancelled."""

    def __init__(self, hub: Hub, *, now: Callable[[], float]) -> None:
        self._hub = hub
        self._now = now
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self, caller: Identity, call: AddressedCall, payload: bytes, respond: Callable[[str, bytes], None]
    ) -> None:
        if call.timeout_s is None:
            result = method_error(MethodErrorCode.BAD_FORMAT, detail="$timeout is not a number", now_s=self._now())
            respond(call.response_topic(result.status), result.payload)
            return
        method = MethodCall(call.name, payload, call.timeout_s)
        task = asyncio.get_running_loop().create_task(
            self._invoke(caller, call, method, respond), name=f"mqtt.method {caller}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _invoke(self, caller: Identity, call: AddressedCall, method: MethodCall, respond: _Respond) -> None:
        result = await self._hub.invoke_method(caller.id, call.target, method)
        respond(call.response_topic(result.status), result.payload)

    def cancel(self) -> None:
        """The connection is over: its calls are abandoned (the targets' late answers are refused by the hub)."""
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
