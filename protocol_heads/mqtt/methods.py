"""The MQTT head's direct-method PUBLISHes (``ModuleCalls.on_publish``): a client's answer to a call the hub
sent it (``$iothub/methods/res/{status}/?$rid=``, handed to the hub, refused when no call waits for it), and the
direct method calls a module makes over MQTT, to another module or a device behind the hub (as Azure IoT
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
from edgehub.core.logtext import shown
from edgehub.core.methods import (
    AddressedCall,
    MethodCall,
    MethodErrorCode,
    method_error,
    parse_addressed_call,
    parse_addressed_response,
)
from edgehub.core.refusals import RefusalReason
from edgehub.hub import Hub
from edgehub.mqtt.packets import ReasonCode
from protocol_heads.mqtt.iothub import is_method_response, parse_method_response

__all__ = ["ModuleCalls", "answer_call"]

log = logging.getLogger(__name__)

_Respond = Callable[[str, bytes], None]  # sends (topic, payload) to the caller
_Refused = Callable[..., None]  # the socket's refusal log: (reason, **detail)


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

    def on_publish(
        self, identity: Identity, topic: str, payload: bytes, respond: _Respond, refused: _Refused
    ) -> tuple[int, str | None] | None:
        """A PUBLISH on a ``$iothub/`` topic: a method answer (to the hub) or a module's call. The PUBACK's reason
        code and Reason String; None for any other topic. A refusal is logged through ``refused``."""
        if is_method_response(topic):
            if answer_call(self._hub, identity, topic, payload):
                return 0, None
            refused(RefusalReason.NO_PENDING_CALL, topic=shown(topic))
            return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "no direct method call is pending"
        relayed = parse_addressed_response(topic)  # a child hub answers for a device behind it (children.py)
        if relayed is not None:
            target, status, rid = relayed
            if self._hub.is_parent(identity, target) and self._hub.method_response(target, rid, status, payload):
                return 0, None
            refused(RefusalReason.NO_PENDING_CALL, topic=shown(topic))
            return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "no direct method call is pending"
        call = parse_addressed_call(topic)
        if call is None:
            return None
        if identity.module_id is None:  # devices do not call methods (IoT Hub)
            refused(RefusalReason.NOT_AUTHORIZED, topic=shown(topic))
            return ReasonCode.NOT_AUTHORIZED, "only modules may call direct methods"
        self.start(identity, call, payload, respond)
        return 0, None

    def start(self, caller: Identity, call: AddressedCall, payload: bytes, respond: _Respond) -> None:
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
