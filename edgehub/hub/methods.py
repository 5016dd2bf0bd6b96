"""Direct methods: a call for a connected device or module, relayed to its link, and its answer back to the caller.

A call comes from the upstream (the cloud, or a parent hub: caller ``$upstream``) or from a module of this hub to
another module or a device behind it (caller ``device/module``), as Azure IoT Edge's hub relays them. The hub
gives each call its own request id (a caller's id is unique only to that caller), sends the request over the
target's ``MethodLink`` and waits for the answer the target's head hands to ``respond``.

Invariants:
* never stored: a call is live or it fails. A target that is not connected, or whose link does not listen for
  methods, is answered 404 at once; one that does not answer within the call's timeout 504; one whose connection
  closes while the call waits 404 (``edgehub.core.methods`` has IoT Hub's codes and bodies);
* bounded: the payload (``MethodLimits.max_payload_bytes``, IoT Hub's 128 KB), the timeout (its range, 5 to
  300 s), the name, the calls pending on one target connection and from one caller
  (``max_pending_per_connection``) and hub-wide (``max_pending``). A call over a bound is answered 400 or 429,
  logged through the refusal log, and costs nothing else;
* a module behind a child hub is reached through the link that stands in for its device (``relays_modules``);
* an answer counts only from the connection the request went to, for a call still pending: anything else is
  refused (``respond`` says False), so a client cannot answer a call it was never sent, and an answer is never
  taken for telemetry.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from edgehub.core import Clock, Identity
from edgehub.core.methods import (
    MAX_METHOD_PAYLOAD_BYTES,
    MAX_METHOD_TIMEOUT_S,
    MIN_METHOD_TIMEOUT_S,
    MethodCall,
    MethodErrorCode,
    MethodResult,
    method_error,
    method_name_problem,
)
from edgehub.core.opstats import OpStats
from edgehub.core.refusals import RateLimitedLog, RefusalLog, RefusalReason

__all__ = ["UPSTREAM_CALLER", "MethodDispatcher", "MethodLimits", "MethodLink"]

log = logging.getLogger(__name__)

UPSTREAM_CALLER = "$upstream"


@runtime_checkable
class MethodLink(Protocol):
    """A client link that can carry method requests (a head's ``ClientLink`` implements both)."""

    @property
    def relays_modules(self) -> bool:
        """The link stands in for a device behind a child hub, and so for that device's modules too."""
        ...

    def send_method_request(self, rid: str, name: str, payload: bytes, target: Identity) -> bool:
        """Send the request for ``target`` (the link's own identity, or a module it relays for) to the client
        without blocking; False when the client does not listen for method calls (it has not subscribed to them)
        or is gone."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class MethodLimits:
    """The bounds on direct method calls. Units are in the names."""

    max_payload_bytes: int = MAX_METHOD_PAYLOAD_BYTES
    min_timeout_s: float = MIN_METHOD_TIMEOUT_S
    max_timeout_s: float = MAX_METHOD_TIMEOUT_S
    max_pending_per_connection: int = 16  # calls waiting on one target connection, and from one module caller
    max_pending: int = 1024  # calls waiting hub-wide

    def __post_init__(self) -> None:
        if self.max_payload_bytes < 1 or self.max_pending_per_connection < 1 or self.max_pending < 1:
            raise ValueError("max_payload_bytes, max_pending_per_connection and max_pending must be positive")
        if not 0 < self.min_timeout_s <= self.max_timeout_s:
            raise ValueError("timeouts must satisfy 0 < min_timeout_s <= max_timeout_s")


@dataclass(slots=True)
class _Call:
    caller: str
    target: Identity
    link: MethodLink
    future: asyncio.Future[MethodResult]


@dataclass(slots=True)
class _Target:
    link: MethodLink
    pending: set[str] = field(default_factory=set)  # request ids in flight on this link


class MethodDispatcher:
    """The links that can take method calls, and the calls waiting for their answers."""

    def __init__(self, *, clock: Clock, refusals: RefusalLog, limits: MethodLimits | None = None) -> None:
        self.limits = limits or MethodLimits()
        self._clock = clock
        self._refusals = refusals
        # The lines a call causes (target away, timed out, answered): the caller's doing, rate-limited per caller.
        self._events = RateLimitedLog(log, clock=clock)
        self._targets: dict[str, _Target] = {}  # identity id -> its current link
        self._calls: dict[str, _Call] = {}  # request id -> call
        self._per_caller: dict[str, int] = {}
        self._rids = itertools.count(1)
        # Every call and the time to its answer, by caller and target (Azure's from, to), for /metrics.
        self.calls = OpStats("from", "to")

    @property
    def pending(self) -> int:
        return len(self._calls)

    # -- links (the facade's connect and disconnect) ------------------------------------------------------
    def connect(self, identity: Identity, link: object) -> None:
        old = self._targets.pop(identity.id, None)
        if old is not None and old.link is not link:
            self._close_calls(old, MethodErrorCode.CONNECTION_CLOSED)
        if isinstance(link, MethodLink):
            self._targets[identity.id] = _Target(link)

    def disconnect(self, identity: Identity, link: object) -> None:
        target = self._targets.get(identity.id)
        if target is None or target.link is not link:
            return  # an older link, after a takeover: the calls on it were closed then
        del self._targets[identity.id]
        self._close_calls(target, MethodErrorCode.CONNECTION_CLOSED)

    def _close_calls(self, target: _Target, code: MethodErrorCode) -> None:
        for rid in list(target.pending):
            call = self._calls.get(rid)
            if call is not None and not call.future.done():
                call.future.set_result(method_error(code, now_s=self._clock.time()))
        target.pending.clear()

    def _target(self, identity: Identity) -> _Target | None:
        """The link calls for ``identity`` go to: its own, or for a module behind a child hub its device's."""
        entry = self._targets.get(identity.id)
        if entry is None and identity.module_id is not None:
            gateway = self._targets.get(identity.device_id)
            if gateway is not None and gateway.link.relays_modules:
                return gateway
        return entry

    # -- calls --------------------------------------------------------------------------------------------
    def _refuse(
        self, reason: RefusalReason, code: MethodErrorCode, caller: str, target: Identity, why: str
    ) -> MethodResult:
        self._refusals.refused(reason, peer=caller, client=caller, target=target.id, detail=why)
        return method_error(code, detail=why, now_s=self._clock.time())

    def _problem(self, call: MethodCall) -> str | None:
        lim = self.limits
        problem = method_name_problem(call.name)
        if problem is not None:
            return problem
        if len(call.payload) > lim.max_payload_bytes:
            return f"payload of {len(call.payload)} bytes is over {lim.max_payload_bytes}"
        if not lim.min_timeout_s <= call.timeout_s <= lim.max_timeout_s:
            return f"timeout {call.timeout_s} s is outside {lim.min_timeout_s}..{lim.max_timeout_s} s"
        return None

    async def invoke(self, caller: str, target: Identity, call: MethodCall) -> MethodResult:
        """Relay ``call`` from ``caller`` to ``target`` and return its answer; never raises for what was sent."""
        started = self._clock.monotonic()
        try:
            return await self._invoke(caller, target, call)
        finally:  # refused and failed calls too, as Azure times every call
            self.calls.add(caller, target.id, seconds=self._clock.monotonic() - started)

    async def _invoke(self, caller: str, target: Identity, call: MethodCall) -> MethodResult:
        problem = self._problem(call)
        if problem is not None:
            return self._refuse(RefusalReason.METHOD_INVALID, MethodErrorCode.BAD_FORMAT, caller, target, problem)
        entry = self._target(target)
        if entry is None:
            self._events.line(caller, "method.not_online", caller=caller, target=target, method=call.name)
            return method_error(MethodErrorCode.DEVICE_NOT_ONLINE, now_s=self._clock.time())
        lim = self.limits
        by_caller = self._per_caller.get(caller, 0)
        if (
            len(self._calls) >= lim.max_pending
            or len(entry.pending) >= lim.max_pending_per_connection
            or (caller != UPSTREAM_CALLER and by_caller >= lim.max_pending_per_connection)
        ):
            why = f"pending calls at their bound ({len(self._calls)} hub-wide, {len(entry.pending)} on the target)"
            return self._refuse(RefusalReason.TOO_MANY_CALLS, MethodErrorCode.THROTTLED, caller, target, why)
        rid = format(next(self._rids), "x")
        if not entry.link.send_method_request(rid, call.name, call.payload, target):
            self._events.line(caller, "method.not_listening", caller=caller, target=target, method=call.name)
            return method_error(MethodErrorCode.DEVICE_NOT_ONLINE, now_s=self._clock.time())
        future: asyncio.Future[MethodResult] = asyncio.get_running_loop().create_future()
        self._calls[rid] = _Call(caller, target, entry.link, future)
        entry.pending.add(rid)
        self._per_caller[caller] = by_caller + 1
        try:
            async with asyncio.timeout(call.timeout_s):
                result = await future
        except TimeoutError:
            self._events.line(
                caller, "method.timeout", caller=caller, target=target, method=call.name, timeout_s=call.timeout_s
            )
            result = method_error(MethodErrorCode.GATEWAY_TIMEOUT, now_s=self._clock.time())
        finally:
            del self._calls[rid]
            entry.pending.discard(rid)
            left = self._per_caller[caller] - 1
            if left:
                self._per_caller[caller] = left
            else:
                del self._per_caller[caller]
        self._events.line(
            caller, "method.answered", caller=caller, target=target, method=call.name, status=result.status
        )
        return result

    def respond(self, identity: Identity, rid: str, status: int, payload: bytes) -> bool:
        """The answer ``identity`` sent for request ``rid``; False (the head refuses and logs it) unless a call
        sent to that identity's current link is waiting for it."""
        call = self._calls.get(rid)
        target = self._target(identity)
        if call is None or call.target != identity or target is None or call.link is not target.link:
            return False  # the head refuses the answer and logs it, with the peer's address
        if len(payload) > self.limits.max_payload_bytes:
            why = f"response payload of {len(payload)} bytes is over {self.limits.max_payload_bytes}"
            result = self._refuse(RefusalReason.METHOD_INVALID, MethodErrorCode.BAD_FORMAT, identity.id, identity, why)
        else:
            result = MethodResult(status, payload)
        if not call.future.done():
            call.future.set_result(result)
        return True
