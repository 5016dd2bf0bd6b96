"""A complete in-memory ``edgehub.hub.Hub`` for testing protocol heads: it routes nothing and stores in memory.

Steering:
* ``add_identity(identity, key_b64=..., password=..., thumbprint=...)`` makes an identity that can log in with a
  SAS token (resource ``{host_name}/devices/{d}[/modules/{m}]``), a plain password, or a certificate thumbprint.
* ``refuse(reason, count=1)`` makes the next ``count`` messages come back ``Rejected(reason)``.
* ``fail_next_ingest()`` makes the next ``ingest`` raise ``StorageIOError`` (the disk said no; nothing stored), or
  the ``StoreError`` given (``StoreClosedError``: a store that cannot write on this connection at all).
* ``hold()`` makes ``ingest`` wait (messages are not durable yet) until ``release()``; ``held_groups`` tells
  how many groups wait, and ``wait_held(n)`` waits for that.
* ``hold_logins()`` makes ``authenticate`` wait, once it has checked the credentials and before it answers,
  until ``release_logins()``;
  ``wait_login_held()`` waits for one to wait. ``remove_identity(identity)`` forgets an identity's secrets
  (a revocation).
* ``enqueue(identity, input_name, message)`` queues a message for a module input (or device-bound with
  ``input_name=None``); it goes out over the identity's link as its window allows, and is redelivered with
  ``redelivery=True`` if it was in flight when the link went away.

Invariants: outcomes come back in message order; ``stored`` holds exactly the messages answered ``Stored``,
in ingest order (the order of the ``ingest`` calls, also when held groups are released together, as the real
hub's group commit keeps them); ``groups`` records the size of every ingest call (one per socket read on the
head side).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgehub.core import (
    AuthenticationError,
    Clock,
    DeliveryError,
    Identity,
    Message,
    StorageIOError,
    StoreError,
    SystemClock,
)
from edgehub.core.methods import MethodCall, MethodResult
from edgehub.core.refusals import RefusalLog, RefusalReason
from edgehub.core.sas import resource_uri, verify_sas_token
from edgehub.hub import (
    AuthResult,
    ClientLink,
    Credentials,
    Delivery,
    IngestOutcome,
    Rejected,
    SessionInfo,
    Stored,
)
from edgehub.hub.methods import MethodDispatcher
from edgehub.hub.twins import parse_reported_patch

__all__ = ["InMemoryHub"]


@dataclass(slots=True)
class _Secrets:
    key_b64: str | None = None
    password: bytes | None = None
    thumbprint: str | None = None


@dataclass(slots=True)
class _Mailbox:
    """Deliveries for one identity: waiting ones, and those in flight on the current link."""

    waiting: deque[Delivery] = field(default_factory=deque)
    inflight: dict[int, Delivery] = field(default_factory=dict)
    link: ClientLink | None = None


class InMemoryHub:
    """Implements ``edgehub.hub.Hub``; see the module docstring for how to steer it."""

    def __init__(self, *, host_name: str = "edgehub.local", clock: Clock | None = None) -> None:
        self.host_name = host_name
        self.clock: Clock = clock or SystemClock()
        self.stored: list[tuple[Identity, Message]] = []
        self.rejected: list[tuple[Identity, Message, str]] = []
        self.groups: list[int] = []
        self.acked: list[tuple[Identity, int, bool]] = []
        self.dead_lettered: list[tuple[Identity, int, str]] = []  # deliveries the client rejected for good
        self.connects: list[Identity] = []
        self.disconnects: list[str] = []
        self.twins: dict[str, dict[str, Any]] = {}
        self._secrets: dict[str, _Secrets] = {}
        self._refusals: deque[RefusalReason] = deque()
        self._held = False
        self._fail_next: StoreError | None = None
        self._release = asyncio.Event()
        self._held_count = 0
        self._previous: asyncio.Future[None] | None = None  # the latest ingest call's turn (see ingest)
        self._changed = asyncio.Condition()
        self._mailboxes: dict[str, _Mailbox] = {}
        self._ids = itertools.count(1)
        self._edge_ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._login_gate: asyncio.Event | None = None
        self._logins_held = 0
        # Direct methods: the real dispatcher (it holds no store), so a head's method path runs as with EdgeHub.
        self.methods = MethodDispatcher(clock=self.clock, refusals=RefusalLog(logging.getLogger(__name__)))

    # --- steering ----------------------------------------------------------------------------------------

    def add_identity(
        self,
        identity: Identity,
        *,
        key_b64: str | None = None,
        password: bytes | None = None,
        thumbprint: str | None = None,
    ) -> None:
        self._secrets[identity.id] = _Secrets(key_b64, password, thumbprint)

    def remove_identity(self, identity: Identity) -> None:
        self._secrets.pop(identity.id, None)

    def hold_logins(self) -> None:
        self._login_gate = asyncio.Event()

    def release_logins(self) -> None:
        if self._login_gate is not None:
            self._login_gate.set()
        self._login_gate = None

    async def wait_login_held(self) -> None:
        """Return once an ``authenticate`` waits at the gate. Bound it with ``asyncio.timeout``."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._logins_held > 0)

    def refuse(self, reason: RefusalReason, count: int = 1) -> None:
        self._refusals.extend([reason] * count)

    def fail_next_ingest(self, error: StoreError | None = None) -> None:
        self._fail_next = error or StorageIOError("in-memory hub told to fail this ingest")

    def hold(self) -> None:
        self._held = True
        self._release.clear()

    def release(self) -> None:
        self._held = False
        self._release.set()

    @property
    def held_groups(self) -> int:
        return self._held_count

    async def wait_held(self, count: int = 1) -> None:
        """Return once ``count`` ingest groups are held. Bound it with ``asyncio.timeout``."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._held_count >= count)

    async def wait_stored(self, count: int) -> None:
        """Return once ``count`` messages are stored. Bound it with ``asyncio.timeout``."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.stored) >= count)

    async def wait_connected(self, identity: Identity) -> None:
        """Return once ``identity`` has a link. Bound it with ``asyncio.timeout``."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._link_of(identity) is not None)

    async def wait_disconnected(self, identity: Identity) -> None:
        """Return once ``identity`` was connected and its link has gone (its will, if any, is stored by then)."""
        async with self._changed:
            await self._changed.wait_for(lambda: identity.id in self.disconnects)

    def _link_of(self, identity: Identity) -> ClientLink | None:
        box = self._mailboxes.get(identity.id)
        return None if box is None else box.link

    async def wait_acked(self, count: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.acked) >= count)

    def enqueue(self, identity: Identity, input_name: str | None, message: Message) -> int:
        box = self._mailboxes.setdefault(identity.id, _Mailbox())
        delivery = Delivery(next(self._ids), message, input_name)
        box.waiting.append(delivery)
        self._pump(box)
        return delivery.delivery_id

    def pending(self, identity: Identity) -> int:
        """Deliveries not yet acknowledged (waiting or in flight)."""
        box = self._mailboxes.get(identity.id)
        return 0 if box is None else len(box.waiting) + len(box.inflight)

    # --- Hub ---------------------------------------------------------------------------------------------

    async def authenticate(self, credentials: Credentials) -> AuthResult:
        result = self._check(credentials)
        gate = self._login_gate
        if gate is not None:  # checked, not yet answered: as the real registry is while scrypt runs in a thread
            self._logins_held += 1
            async with self._changed:
                self._changed.notify_all()
            await gate.wait()
        return result

    def _check(self, credentials: Credentials) -> AuthResult:
        identity = credentials.identity
        secrets = self._secrets.get(identity.id)
        if secrets is None:
            raise AuthenticationError(f"unknown identity {identity}")
        if credentials.cert_thumbprint is not None and secrets.thumbprint is not None:
            if credentials.cert_thumbprint.lower() == secrets.thumbprint.lower():
                return AuthResult(identity, "x509")
            raise AuthenticationError(f"certificate thumbprint does not match for {identity}")
        if credentials.password is None:
            raise AuthenticationError(f"no credentials for {identity}")
        text = credentials.password.decode("utf-8", errors="replace")
        if text.startswith("SharedAccessSignature ") and secrets.key_b64 is not None:
            resource = resource_uri(self.host_name, identity)
            verify_sas_token(text, resource=resource, key_b64=secrets.key_b64, clock=self.clock)
            return AuthResult(identity, "sas")
        if secrets.password is not None and credentials.password == secrets.password:
            return AuthResult(identity, "password")
        raise AuthenticationError(f"bad credentials for {identity}")

    async def ingest(self, identity: Identity, messages: Sequence[Message]) -> list[IngestOutcome]:
        # Calls store in the order they were made: each waits for the one before it (held groups, released
        # together, would otherwise wake in any order).
        previous, turn = self._previous, asyncio.get_running_loop().create_future()
        self._previous = turn
        try:
            return await self._ingest_in_turn(identity, messages, previous)
        finally:
            turn.set_result(None)

    async def _ingest_in_turn(
        self, identity: Identity, messages: Sequence[Message], previous: asyncio.Future[None] | None
    ) -> list[IngestOutcome]:
        self.groups.append(len(messages))
        if self._held:
            self._held_count += 1
            await self._notify()
            try:
                await self._release.wait()
            finally:
                self._held_count -= 1
        if previous is not None:
            await asyncio.shield(previous)  # shielded: a cancelled caller must not cancel the turn before it
        if self._fail_next is not None:
            error, self._fail_next = self._fail_next, None
            raise error
        outcomes: list[IngestOutcome] = []
        for message in messages:
            if self._refusals:
                reason = self._refusals.popleft()
                self.rejected.append((identity, message, reason))
                outcomes.append(Rejected(reason))
                continue
            edge_id = str(next(self._edge_ids))
            self.stored.append((identity, message.with_system_properties(edgeMessageId=edge_id)))
            outcomes.append(Stored(edge_id))
        await self._notify()
        return outcomes

    async def connect(self, identity: Identity, link: ClientLink, *, clean_session: bool) -> SessionInfo:
        box = self._mailboxes.setdefault(identity.id, _Mailbox())
        present = not clean_session and bool(box.waiting or box.inflight)
        self._requeue(box)
        if clean_session:
            box.waiting.clear()
        box.link = link
        self.methods.connect(identity, link)
        self.connects.append(identity)
        self._pump(box)
        await self._notify()
        return SessionInfo(session_present=present)

    async def disconnect(self, identity: Identity, link: ClientLink) -> None:
        self.methods.disconnect(identity, link)
        box = self._mailboxes.get(identity.id)
        if box is None or box.link is not link:
            return
        box.link = None
        self._requeue(box)
        self.disconnects.append(identity.id)
        await self._notify()

    def delivered(self, identity: Identity, delivery_id: int, ok: bool) -> None:
        box = self._mailboxes.get(identity.id)
        if box is None or box.inflight.pop(delivery_id, None) is None:
            return
        self.acked.append((identity, delivery_id, ok))
        # Sends nothing, as the Hub protocol says: the head's link_ready after the acks of a read does.
        task = asyncio.get_running_loop().create_task(self._notify())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def delivered_many(self, identity: Identity, outcomes: Iterable[tuple[int, bool]]) -> None:
        for delivery_id, ok in outcomes:
            self.delivered(identity, delivery_id, ok)

    def dead_letter(self, identity: Identity, delivery_id: int, reason: str) -> None:
        box = self._mailboxes.get(identity.id)
        if box is None or box.inflight.pop(delivery_id, None) is None:
            return
        self.dead_lettered.append((identity, delivery_id, reason))
        task = asyncio.get_running_loop().create_task(self._notify())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def link_ready(self, identity: Identity, link: ClientLink) -> None:
        box = self._mailboxes.get(identity.id)
        if box is not None and box.link is link:
            self._pump(box)

    def is_parent(self, parent: Identity, child: Identity) -> bool:
        return False  # no gateways behind this hub

    async def invoke_method(self, caller: str, target: Identity, call: MethodCall) -> MethodResult:
        return await self.methods.invoke(caller, target, call)

    def method_response(self, identity: Identity, rid: str, status: int, payload: bytes) -> bool:
        return self.methods.respond(identity, rid, status, payload)

    async def get_twin(self, identity: Identity) -> Mapping[str, Any]:
        twin = self.twins.setdefault(identity.id, {"desired": {"$version": 1}, "reported": {"$version": 1}})
        return copy.deepcopy(twin)

    async def update_reported(self, identity: Identity, patch: bytes | Mapping[str, Any]) -> int:
        if isinstance(patch, bytes):  # the real hub's parser and limits: a head sees the same refusals
            patch = parse_reported_patch(patch)
        twin = self.twins.setdefault(identity.id, {"desired": {"$version": 1}, "reported": {"$version": 1}})
        reported = twin["reported"]
        _merge(reported, patch)
        reported["$version"] = int(reported["$version"]) + 1
        return int(reported["$version"])

    # --- internals ---------------------------------------------------------------------------------------

    def _requeue(self, box: _Mailbox) -> None:
        again = [Delivery(d.delivery_id, d.message, d.input_name, True) for d in box.inflight.values()]
        box.inflight.clear()
        box.waiting.extendleft(reversed(again))

    def _pump(self, box: _Mailbox) -> None:
        link = box.link
        while link is not None and box.waiting and link.window_free > 0:
            delivery = box.waiting[0]
            try:
                link.send(delivery)
            except DeliveryError:
                return
            box.waiting.popleft()
            box.inflight[delivery.delivery_id] = delivery

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """JSON merge patch as twins use it: null deletes, objects merge, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
