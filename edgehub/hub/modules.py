"""Delivery to connected modules: the ``ModuleEndpoint`` an executor drives, and the per-module mailboxes the
hub facade feeds from the protocol heads' links.

``ModuleEndpoint("/modules/{m}/inputs/{i}")`` hands a batch (at most ``max_batch``, default 256) to module
``m``'s mailbox and waits until the module acknowledged or refused every message, or its link went away. At most
``window`` deliveries (default 16: ``edgehub run --module-window``, or the deployment's
``delivery.moduleDeliveryWindow``, changed live by ``ModuleMailboxes.window``) are in flight to a mailbox at once,
and never more than its link says it has room for (``link.window_free``: the head's own bound, an MQTT 5 client's
Receive Maximum, an AMQP link's credit): the batch is larger than the window so that the executor checkpoints (a
synced write) once per batch, not once per window.

Invariants:
* a module is addressed by its module id alone: the modules of the edge device (IoT Edge has one device per hub);
* deliveries leave over a link in the order they were queued, never more than ``window`` in flight to a mailbox
  nor more than ``link.window_free`` at once; a window made smaller lets what is in flight drain (nothing is
  taken back), one made larger is filled at once;
* a module that is not connected is a TRANSIENT failure of the whole batch; when its link goes away, every
  delivery waiting or in flight on it fails (TRANSIENT), so the executor retries it, and the retry goes out
  with ``Delivery.redelivery=True`` (MQTT DUP) because its ``attempts`` is above zero;
* when a module connects, every endpoint of that module is told (``on_reachable``), which cuts the executor's
  retry wait short; when its link goes away, they are told it is unreachable (``on_unreachable``), which parks
  their queues until it connects again, so nothing is tried, and no attempt counted, while it is away;
* a delivery the link refuses as PERMANENT (too large for the client, a topic or property its protocol cannot
  carry), or that the client refuses for good (``dead_letter``: AMQP's rejected outcome), is invalid: dead-lettered
  at once with the reason, not retried, and the deliveries behind it go.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from edgehub.core import DeliveryError, FailureKind, Identity
from edgehub.core.endpoints import parse_module_endpoint
from edgehub.core.refusals import RateLimitedLog
from edgehub.delivery import QueuedMessage, SendResult
from edgehub.hub import ClientLink, Delivery

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_WINDOW", "MAX_WINDOW", "MailboxEndpoint", "ModuleEndpoint", "ModuleMailboxes"]

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 16
MAX_WINDOW = 65_535  # MQTT's packet ids in flight at most (and the manifest's bound on moduleDeliveryWindow)
DEFAULT_MAX_BATCH = 256


class _Outcome(StrEnum):
    OK = "ok"
    FAILED = "failed"
    INVALID = "invalid"


# The members as module constants: read per delivery, and a member read through its class costs ~900
# instructions in Python 3.11 (a constant ~0), as the MQTT head's connection states do.
_OK: Final = _Outcome.OK
_FAILED: Final = _Outcome.FAILED
_INVALID: Final = _Outcome.INVALID


class _Batch:
    """One ``deliver`` call's messages: their outcomes, and one future that is done when all are settled.

    One future per batch, not per message: a batch is up to 256 deliveries, and a future each (plus a gather)
    cost more than the MQTT encoding of the message.
    """

    __slots__ = ("errors", "future", "outcomes", "remaining")

    def __init__(self, size: int, future: asyncio.Future[None]) -> None:
        self.outcomes: list[_Outcome | None] = [None] * size
        self.remaining = size
        self.future = future
        self.errors: dict[int, str] = {}  # index -> why the link refused it for good (rare: made when needed)


# A delivery waiting or in flight: (delivery, its batch, its index in the batch). A tuple, not a class: one is
# made for every message delivered to a module.
_Pending = tuple[Delivery, _Batch, int]


@dataclass(slots=True)
class _Mailbox:
    link: ClientLink | None = None
    waiting: deque[_Pending] = field(default_factory=deque)
    inflight: dict[int, _Pending] = field(default_factory=dict)
    on_reachable: list[Callable[[], None]] = field(default_factory=list)
    on_unreachable: list[Callable[[], None]] = field(default_factory=list)


def _settle(p: _Pending, outcome: _Outcome) -> None:
    _, batch, index = p
    if batch.outcomes[index] is None and not batch.future.done():
        batch.outcomes[index] = outcome
        batch.remaining -= 1
        if batch.remaining == 0:
            batch.future.set_result(None)


def _module_key(identity: Identity) -> str:
    assert identity.module_id is not None
    return identity.module_id


class ModuleMailboxes:
    """Per-module mailboxes: which link a module is on, and the deliveries waiting for it or in flight."""

    def __init__(self, key: Callable[[Identity], str] = _module_key, *, window: int = DEFAULT_WINDOW) -> None:
        self._boxes: dict[str, _Mailbox] = {}
        self._window = _checked_window(window)
        self._ids = itertools.count(1)
        # Whose mailbox a connection is: the module id here; the device id for device-bound messages (c2d.py).
        self._key = key
        # A module that refuses or never acks its deliveries causes a line per retry: bounded per endpoint.
        self.events = RateLimitedLog(log)

    @property
    def window(self) -> int:
        """Deliveries in flight to one mailbox at most."""
        return self._window

    @window.setter
    def window(self, window: int) -> None:
        """Change the window live: a larger one is filled now, a smaller one lets what is in flight drain."""
        wider = _checked_window(window) > self._window
        self._window = window
        if wider:
            for box in self._boxes.values():
                self._pump(box)

    def _box(self, module_id: str) -> _Mailbox:
        box = self._boxes.get(module_id)
        if box is None:
            box = self._boxes[module_id] = _Mailbox()
        return box

    def link_of(self, module_id: str) -> ClientLink | None:
        """The link ``module_id`` is connected on, or None."""
        box = self._boxes.get(module_id)
        return box.link if box is not None else None

    def is_connected(self, module_id: str) -> bool:
        box = self._boxes.get(module_id)
        return box is not None and box.link is not None

    def watch(self, module_id: str, on_reachable: Callable[[], None]) -> None:
        self._box(module_id).on_reachable.append(on_reachable)

    def watch_unreachable(self, module_id: str, on_unreachable: Callable[[], None]) -> None:
        self._box(module_id).on_unreachable.append(on_unreachable)

    # -- called by the hub facade for the heads --------------------------------------------------------------
    def connect(self, identity: Identity, link: ClientLink) -> None:
        box = self._box(self._key(identity))
        if box.link is not None and box.link is not link:
            self._fail_inflight(box)  # the old link's deliveries come again, as redeliveries
        box.link = link
        for callback in box.on_reachable:
            callback()
        self._pump(box)

    def disconnect(self, identity: Identity, link: ClientLink) -> None:
        box = self._boxes.get(self._key(identity))
        if box is None or box.link is not link:
            return
        box.link = None
        self._fail_inflight(box)
        while box.waiting:
            _settle(box.waiting.popleft(), _FAILED)
        for callback in box.on_unreachable:
            callback()

    def delivered(self, identity: Identity, outcomes: Iterable[tuple[int, bool]]) -> None:
        """The client settled these deliveries, ``(delivery id, ok)`` each (the acks of one read: the mailbox is
        looked up once for them all)."""
        box = self._boxes.get(self._key(identity))
        if box is None:
            return
        pop = box.inflight.pop
        for delivery_id, ok in outcomes:
            p = pop(delivery_id, None)
            if p is not None:
                _settle(p, _OK if ok else _FAILED)
        # No sending here: the head calls ``link_ready`` once after all the acks of one read, and the window they
        # freed is filled then, in one go (one write for all of it), not one delivery per ack.

    def dead_letter(self, identity: Identity, delivery_id: int, reason: str) -> None:
        """The client refused this delivery for good: it is invalid (dead-lettered with ``reason``), not retried."""
        box = self._boxes.get(self._key(identity))
        p = box.inflight.pop(delivery_id, None) if box is not None else None
        if p is not None:
            p[1].errors[p[2]] = reason
            _settle(p, _INVALID)

    def link_ready(self, identity: Identity, link: ClientLink) -> None:
        box = self._boxes.get(self._key(identity))
        if box is not None and box.link is link:
            self._pump(box)

    # -- called by module endpoints -------------------------------------------------------------------------
    async def deliver(
        self, module_id: str, input_name: str | None, batch: Sequence[QueuedMessage], endpoint_id: str
    ) -> SendResult:
        """Deliver ``batch`` to the client whose mailbox is ``module_id`` (a device id for device-bound messages,
        ``input_name`` None) and wait until each is settled."""
        box = self._box(module_id)
        if box.link is None:
            return SendResult.all_failed(batch, FailureKind.TRANSIENT, f"module {module_id} is not connected")
        batch_state = _Batch(len(batch), asyncio.get_running_loop().create_future())
        ids = self._ids
        box.waiting.extend(
            (Delivery(next(ids), qm.message, input_name, redelivery=qm.attempts > 0), batch_state, i)
            for i, qm in enumerate(batch)
        )
        self._pump(box)
        try:
            if batch:
                await batch_state.future
        finally:
            batch_state.future.cancel()  # cancelled: nothing of this batch may go out any more
        outcomes = batch_state.outcomes
        ok = [qm for qm, o in zip(batch, outcomes, strict=True) if o is _OK]
        # All taken (the usual batch): then nothing failed, and the batch is not gone through again for it.
        failed = [qm for qm, o in zip(batch, outcomes, strict=True) if o is _FAILED] if len(ok) < len(batch) else []
        invalid = (
            [qm for qm, o in zip(batch, outcomes, strict=True) if o is _INVALID]
            if len(ok) + len(failed) < len(batch)
            else []
        )
        if not failed and not invalid:
            return SendResult(succeeded=ok)
        kind = FailureKind.TRANSIENT if failed else FailureKind.PERMANENT
        self.events.line(
            endpoint_id, "module.delivery_failed", endpoint=endpoint_id, failed=len(failed), invalid=len(invalid)
        )
        errors = batch_state.errors
        why = {qm.offset: errors[i] for i, qm in enumerate(batch) if i in errors}
        return SendResult(
            succeeded=ok,
            failed=failed,
            invalid=invalid,
            failure_kind=kind,
            error=f"module {module_id} did not ack" if failed else next(iter(why.values()), "refused for good"),
            invalid_errors=why,
        )

    # -- internals ------------------------------------------------------------------------------------------
    def _fail_inflight(self, box: _Mailbox) -> None:
        for p in box.inflight.values():
            _settle(p, _FAILED)
        box.inflight.clear()

    def _pump(self, box: _Mailbox) -> None:
        link = box.link
        if link is None:
            return
        # Read once, then counted down: only this loop's sends take from the window until it returns (asking the
        # link per delivery showed in the delivery profile).
        waiting, inflight = box.waiting, box.inflight
        free = min(link.window_free, self._window - len(inflight))
        while waiting and free > 0:
            p = waiting[0]
            delivery, batch, _ = p
            if batch.future.cancelled():  # its batch was cancelled
                waiting.popleft()
                continue
            try:
                link.send(delivery)
            except DeliveryError as exc:
                if exc.kind is FailureKind.PERMANENT:
                    waiting.popleft()
                    batch.errors[p[2]] = str(exc)
                    _settle(p, _INVALID)
                    continue
                return  # the link is not ready yet: link_ready pumps again
            waiting.popleft()
            inflight[delivery.delivery_id] = p
            free -= 1


def _checked_window(window: int) -> int:
    if not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"a delivery window is 1 to {MAX_WINDOW}, not {window}")
    return window


class MailboxEndpoint:
    """A ``delivery.Endpoint`` that hands its batches to one mailbox (``key``: a module id, or a device id for
    device-bound messages, ``input_name`` None), as ``ModuleEndpoint`` and ``c2d.DeviceEndpoint`` name it."""

    def __init__(
        self, endpoint_id: str, mailboxes: ModuleMailboxes, key: str, input_name: str | None, *, max_batch: int
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self._id = endpoint_id
        self._key = key
        self._input_name = input_name
        self._mailboxes = mailboxes
        self._max_batch = max_batch

    @property
    def endpoint_id(self) -> str:
        return self._id

    @property
    def max_batch_messages(self) -> int:
        return self._max_batch

    def bind(self, on_reachable: Callable[[], None]) -> None:
        self._mailboxes.watch(self._key, on_reachable)

    def bind_unreachable(self, on_unreachable: Callable[[], None]) -> None:
        self._mailboxes.watch_unreachable(self._key, on_unreachable)

    async def send(self, batch: Sequence[QueuedMessage]) -> SendResult:
        return await self._mailboxes.deliver(self._key, self._input_name, batch, self._id)

    async def close(self) -> None:
        return None


class ModuleEndpoint(MailboxEndpoint):
    """The ``delivery.Endpoint`` for ``/modules/{m}/inputs/{i}``; see the module docstring."""

    def __init__(self, endpoint_id: str, mailboxes: ModuleMailboxes, *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        parsed = parse_module_endpoint(endpoint_id)
        if parsed is None:
            raise ValueError(f"{endpoint_id!r} is not /modules/{{m}}/inputs/{{i}}")
        self.module_id, self.input_name = parsed
        super().__init__(endpoint_id, mailboxes, self.module_id, self.input_name, max_batch=max_batch)
