"""Cloud-to-device messages: a durable queue per device (and priority), delivered when the device connects.

Messages for a device come from the upstream (the cloud, or a parent hub: ``accept``) and from routes whose
sink names the device (``BrokeredEndpoint("/devices/{d}/messages/devicebound")``). Both land in the device's
endpoint ``/devices/{d}/messages/devicebound`` (``edgehub.core.endpoints.device_endpoint``), one sequential store
per priority like a module input's, and a ``DeviceEndpoint`` under an ordinary executor delivers them: the
same window, retry and checkpoints as module inputs (``edgehub.hub.modules``, whose mailboxes it shares, keyed
by device id here).

Invariants:
* ``accept`` returns only once the message is durable in the device's queue (the upstream acknowledges the
  cloud's PUBLISH after it, so a message the cloud had acknowledged survives a restart of the hub);
* delivered only to the device's own connection, and removed only by its ack (the checkpoint), by its TTL, or
  by a queue policy; while the device is away its queues are parked (no attempt counted);
* a device that never connects does not hold the store forever: the TTL (``C2dLimits.ttl_s`` by default, the
  message's ``absolute-expiry-time`` when sooner, never more than ``max_ttl_s``; IoT Hub's default is an hour,
  its most two days) and the per-device bound (``max_queued``, IoT Hub's 50) apply to what the upstream sends,
  the store's queue policies and quotas to every message (the device is the owner its quota share counts);
* the upstream may send only for a device this hub knows (an identity of it), and only messages of at most
  ``max_message_bytes`` (IoT Hub's 64 KB); everything refused is logged through the refusal log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from edgehub.core import (
    DEFAULT_PRIORITY,
    Identity,
    IngestRejected,
    Message,
    MessageTooLargeError,
    QuotaExceededError,
    RouteResult,
    SystemProperty,
)
from edgehub.core.endpoints import device_endpoint, parse_device_endpoint
from edgehub.core.refusals import RateLimitedLog, RefusalReason
from edgehub.hub.modules import DEFAULT_MAX_BATCH, MailboxEndpoint, ModuleMailboxes
from edgehub.store import Store

__all__ = ["C2dLimits", "CloudToDevice", "DeviceEndpoint"]

log = logging.getLogger(__name__)

_EXPIRY: str = SystemProperty.ABSOLUTE_EXPIRY_TIME.value
_TO: str = SystemProperty.TO.value


@dataclass(frozen=True, slots=True, kw_only=True)
class C2dLimits:
    """Bounds on the messages the upstream sends for devices. Units are in the names."""

    ttl_s: int = 3600  # IoT Hub's default time-to-live of a cloud-to-device message
    max_ttl_s: int = 172_800  # IoT Hub's most: two days
    max_queued: int = 50  # IoT Hub's per-device queue depth
    max_message_bytes: int = 65_536  # IoT Hub's most for one cloud-to-device message
    priority: int = DEFAULT_PRIORITY

    def __post_init__(self) -> None:
        if not 0 < self.ttl_s <= self.max_ttl_s or self.max_queued < 1 or self.max_message_bytes < 1:
            raise ValueError("need 0 < ttl_s <= max_ttl_s, and max_queued and max_message_bytes positive")


def _device_key(identity: Identity) -> str:
    return identity.device_id


class DeviceEndpoint(MailboxEndpoint):
    """The ``delivery.Endpoint`` for ``/devices/{d}/messages/devicebound``: a batch to the device's connection."""

    def __init__(self, endpoint_id: str, mailboxes: ModuleMailboxes, *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        device = parse_device_endpoint(endpoint_id)
        if device is None:
            raise ValueError(f"{endpoint_id!r} is not /devices/{{d}}/messages/devicebound")
        self.device_id = device
        super().__init__(endpoint_id, mailboxes, device, None, max_batch=max_batch)


class CloudToDevice:
    """The devices' mailboxes and the upstream's way into their queues."""

    def __init__(
        self,
        store: Store,
        *,
        known: Callable[[Identity], bool],
        limits: C2dLimits | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self.store = store
        self.limits = limits or C2dLimits()
        self.mailboxes = ModuleMailboxes(key=_device_key)
        self._known = known
        self._max_batch = max_batch
        self._lock = asyncio.Lock()  # the per-device bound is checked and taken one message at a time
        self._events = RateLimitedLog(log, clock=store.clock)  # the cloud decides how many: a line per device
        self.accepted = 0  # messages the upstream handed in that are durable (since start)
        self._changed = asyncio.Event()

    def endpoint(self, endpoint_id: str) -> DeviceEndpoint | None:
        if parse_device_endpoint(endpoint_id) is None:
            return None
        return DeviceEndpoint(endpoint_id, self.mailboxes, max_batch=self._max_batch)

    def ttl_s(self, message: Message) -> int:
        """The limits' TTL, or less when the message's ``absolute-expiry-time`` comes sooner (at least 1 s)."""
        ttl = self.limits.ttl_s
        expiry = message.system_properties.get(_EXPIRY)
        if expiry:
            try:
                at = datetime.fromisoformat(expiry.replace("Z", "+00:00")).timestamp()
            except ValueError:
                return ttl  # not a time: the default holds (the property still goes to the device as it was)
            ttl = max(1, min(ttl, int(at - self.store.clock.time())))
        return ttl

    async def accept(self, device_id: str, message: Message) -> str:
        """Store ``message`` (stamped) for ``device_id``; its endpoint id once durable. Raises ``IngestRejected``."""
        try:
            identity = Identity.parse(device_id)
        except ValueError as exc:
            raise IngestRejected(f"{device_id!r} is not a device id", reason=RefusalReason.UNKNOWN_DEVICE) from exc
        if identity.module_id is not None or not self._known(identity):
            raise IngestRejected(f"no device {device_id!r} on this hub", reason=RefusalReason.UNKNOWN_DEVICE)
        size = len(message.body)
        if size > self.limits.max_message_bytes:
            raise MessageTooLargeError(f"{size} bytes for {device_id}; at most {self.limits.max_message_bytes}")
        endpoint = device_endpoint(device_id)
        if _TO not in message.system_properties:
            # IoT Hub tells the device where the message went, in its own spelling (the SDK shows it as ``to``).
            to = f"/devices/{device_id}/messages/deviceBound"
            message = Message(message.body, message.properties, {**message.system_properties, _TO: to})
        result = RouteResult(endpoint, self.limits.priority, self.ttl_s(message))
        async with self._lock:
            held, _ = self.store.usage(endpoint)
            if held >= self.limits.max_queued:
                raise QuotaExceededError(
                    f"{held} messages wait for {device_id}; at most {self.limits.max_queued}",
                    reason=RefusalReason.DEVICE_QUEUE_FULL,
                )
            # The device is the owner its store share counts: a flood for one device cannot take the store.
            [outcome], durable = await self.store.admit_many([(message, [result])], sender=device_id)
        if durable:  # written after the lock: the next message's check sees this one's usage already
            await asyncio.gather(*durable)
        if isinstance(outcome, IngestRejected):
            raise outcome
        receipt = outcome
        if not receipt.refs:
            raise QuotaExceededError(f"the store dropped the message for {device_id} (its overflow policy)")
        self.accepted += 1
        self._changed.set()
        self._events.line(device_id, "c2d.accepted", device=device_id, ttl_s=result.ttl_s, accepted=self.accepted)
        return endpoint

    async def wait_accepted(self, count: int) -> None:
        """Return once ``accepted`` reached ``count`` (for tools and tests; bound it with ``asyncio.timeout``)."""
        while self.accepted < count:
            self._changed.clear()
            await self._changed.wait()

    def has_queued(self, device_id: str) -> bool:
        return self.store.usage(device_endpoint(device_id))[0] > 0
