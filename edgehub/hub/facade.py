"""``EdgeHub``: the real hub facade (``edgehub.hub.Hub``) over the router, the store and the endpoint executors.

Use: ``async with EdgeHub(store=..., router=..., host_name=...) as hub: ...`` (the caller owns the store and
closes it after the hub). Inside the block the hub runs one ``EndpointExecutor`` per endpoint with a
deliverer: every module input the routes or the store's queues name (created at start, and when a route first
names a new one), and any endpoint passed in ``endpoints`` (an upstream transport, for instance).
Endpoints without a deliverer (``$upstream`` when no transport is given) keep their messages queued.

Partitions and duplicates (``upstream=UpstreamOptions(...)``, the manifest's ``upstream`` section):
* a message whose ``sessionId`` and ``partitionKey`` are both set and differ is refused
  (``Rejected("partition_key_mismatch")``), whatever the partition count;
* with ``partitions`` N > 1, the route results for ``$upstream`` go to the message's lane ``$upstream/{i}``
  (``edgehub.hub.lanes``); the lanes' endpoints come in ``endpoints`` like any other, one per lane id;
* with ``duplicate_detection``, a message whose ``messageId`` this identity already had accepted inside the
  window is answered ``Stored(duplicate=True)`` and dropped (``duplicates_dropped``); the accepted ids are
  recorded in the store's metadata in the message's own group write (``edgehub.hub.dedup``), so a failed
  write never marks a message seen and a restart remembers the window.

Invariants:
* ``ingest`` routes and enqueues the messages of a group in their order, and the store's group commit writes
  them in one batch; with duplicate detection (or quotas, in the store) each is admitted in turn, so one that
  waits (for room, or for a copy of itself in flight) holds the ones after it and none overtakes another. It
  answers ``Stored`` only once a message is durable in every routed queue (a message no route takes is
  answered ``Stored`` too, as IoT Hub does: the device did nothing wrong), ``Rejected(reason)`` for an
  ``IngestRejected``, and raises only ``StoreError``;
* the hub, not the head, is the authority for ``connectionDeviceId``, ``connectionModuleId`` and
  ``connectionAuthMethod`` (stamped from the authenticated identity);
* twins live in the store's metadata (``twin/{identity}``), the recently used ones in memory too
  (``edgehub.hub.twins``); a reported patch (raw bytes from a head, or a ``Mapping``) is checked against
  ``twin_limits``, merged (JSON merge patch) and written durably before its new version is returned, or refused
  with ``TwinError`` (IoT Hub's status) and nothing changed; once written, it is routed as a twin change
  notification (``FROM /twinChangeNotifications``; body ``{"version", "properties": {"reported": patch}}``);
* a module's twin GET answers the desired properties its deployment gives it (``set_module_desired``), and a
  change is pushed to it at once as the merge patch from what it had, on a link that can (``TwinLink``);
* cloud-to-device messages (``edgehub.hub.c2d``) and direct methods (``edgehub.hub.methods``) live in their own
  modules; the facade only hands them the links (``connect``/``disconnect``) and the calls: ``cloud_to_device``
  and ``invoke_method`` (``edgehub.core.methods.CloudCommands``, for the upstream and for modules) and
  ``method_response`` (for the heads);
* every refusal the hub makes (ingest, twins) is logged through ``refusals`` (a ``RefusalLog``: rate-limited
  per identity), so a device flooding refused messages cannot flood the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from edgehub.core import (
    Clock,
    Identity,
    IngestRejected,
    Message,
    RouteResult,
    SystemClock,
    SystemProperty,
    TwinError,
)
from edgehub.core.endpoints import parse_module_endpoint
from edgehub.core.message import TWIN_CHANGE_NOTIFICATION
from edgehub.core.methods import MethodCall, MethodResult
from edgehub.core.refusals import RefusalLog
from edgehub.core.sas import DEFAULT_MAX_TOKEN_LIFETIME_S
from edgehub.delivery import Endpoint, EndpointExecutor, ExecutorSettings
from edgehub.hub import (
    AuthResult,
    ClientLink,
    Credentials,
    IngestOutcome,
    Rejected,
    SessionInfo,
    Stored,
    TwinLink,
)
from edgehub.hub.c2d import C2dLimits, CloudToDevice
from edgehub.hub.dedup import Claim, DuplicateWindow
from edgehub.hub.identities import IdentityRegistry
from edgehub.hub.lanes import UpstreamLanes, UpstreamLanesStatus, UpstreamOptions, check_partition_properties
from edgehub.hub.methods import MethodDispatcher, MethodLimits
from edgehub.hub.modules import DEFAULT_MAX_BATCH, ModuleEndpoint, ModuleMailboxes
from edgehub.hub.stamps import Stamper
from edgehub.hub.twins import (
    DEFAULT_TWIN_LIMITS,
    TwinLimits,
    TwinStore,
    check_patch,
    merge_diff,
    parse_reported_patch,
)
from edgehub.routing import Router
from edgehub.store import EnqueueReceipt, Store

__all__ = ["EdgeHub"]

log = logging.getLogger(__name__)

_EDGE_MESSAGE_ID: str = SystemProperty.EDGE_MESSAGE_ID.value
_CONNECTION_MODULE_ID: str = SystemProperty.CONNECTION_MODULE_ID.value
_SESSION_ID: str = SystemProperty.SESSION_ID.value
_PARTITION_KEY: str = SystemProperty.PARTITION_KEY.value
_MESSAGE_TYPE: str = SystemProperty.MESSAGE_TYPE.value
_CONTENT_TYPE: str = SystemProperty.CONTENT_TYPE.value
_CONTENT_ENCODING: str = SystemProperty.CONTENT_ENCODING.value


class EdgeHub:
    """Implements ``edgehub.hub.Hub``; see the module docstring."""

    def __init__(
        self,
        *,
        store: Store,
        router: Router,
        host_name: str,
        clock: Clock | None = None,
        module_batch: int = DEFAULT_MAX_BATCH,
        executor_settings: ExecutorSettings | None = None,
        endpoints: Iterable[Endpoint] = (),
        upstream: UpstreamOptions | None = None,
        max_token_lifetime_s: float | None = DEFAULT_MAX_TOKEN_LIFETIME_S,
        twin_limits: TwinLimits = DEFAULT_TWIN_LIMITS,
        refusals: RefusalLog | None = None,
        c2d_limits: C2dLimits | None = None,
        method_limits: MethodLimits | None = None,
    ) -> None:
        self.store = store
        self.router = router
        self.clock: Clock = clock or SystemClock()
        self._stamper = Stamper(store.clock)  # enqueuedTime on the store's clock, as its references' times
        self.identities = IdentityRegistry(
            store, host_name=host_name, clock=self.clock, max_token_lifetime_s=max_token_lifetime_s
        )
        self.modules = ModuleMailboxes()
        self._batch = module_batch
        self._settings = executor_settings or ExecutorSettings()
        # Each executor's own settings by endpoint id (a deployment gives endpoints their own policies); an
        # executor started later (a route naming a new module input) takes what this says then.
        self.executor_settings_for: Callable[[str], ExecutorSettings] = lambda _endpoint_id: self._settings
        self._given = {e.endpoint_id: e for e in endpoints}
        self.executors: dict[str, EndpointExecutor] = {}
        self._auth_methods: dict[str, str] = {}
        self._stack: contextlib.AsyncExitStack | None = None
        self._starting: dict[str, asyncio.Task[None]] = {}
        self.twins = TwinStore(store, twin_limits)
        # module id -> (desired properties, version) from the deployment's modulesContent
        self._module_desired: dict[str, tuple[dict[str, Any], int]] = {}
        self._twin_lock = asyncio.Lock()  # a patch is merged and written: one at a time, so none is lost
        self.refusals = refusals or RefusalLog(log, clock=self.clock)
        self.c2d = CloudToDevice(
            store, known=lambda i: self.identities.get(i) is not None, limits=c2d_limits, max_batch=module_batch
        )
        self.methods = MethodDispatcher(clock=self.clock, refusals=self.refusals, limits=method_limits)
        self.upstream = upstream or UpstreamOptions()
        self.lanes = UpstreamLanes(
            self.upstream, store=store, endpoint_of=self._given.get, executor_of=self.executors.get
        )
        self._dedup: DuplicateWindow | None = None
        if self.upstream.duplicate_detection:
            self._dedup = DuplicateWindow(
                store,
                clock=self.clock,
                window_s=self.upstream.duplicate_window_s,
                max_entries=self.upstream.max_duplicate_ids,
            )

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        if self._dedup is not None:
            self._dedup.load()
        self._stack = contextlib.AsyncExitStack()
        await self._stack.__aenter__()
        named = {r.result.endpoint for r in self.router.routes} | {q.endpoint for q in self.store.queues()}
        for endpoint_id in sorted(named | set(self._given)):
            await self._ensure_executor(endpoint_id)
        log.info(
            "hub.started executors=%s partitions=%d duplicate_detection=%s",
            sorted(self.executors),
            self.upstream.partitions,
            self.upstream.duplicate_detection,
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.__aexit__(exc_type, exc, tb)
        self.executors.clear()
        log.info("hub.stopped")

    def _endpoint_for(self, endpoint_id: str) -> Endpoint | None:
        given = self._given.get(endpoint_id)
        if given is not None:
            return given
        if parse_module_endpoint(endpoint_id) is not None:
            return ModuleEndpoint(endpoint_id, self.modules, max_batch=self._batch)
        return self.c2d.endpoint(endpoint_id)

    async def _ensure_executor(self, endpoint_id: str) -> None:
        if endpoint_id in self.executors or self._stack is None:
            return
        endpoint = self._endpoint_for(endpoint_id)
        if endpoint is None:
            return
        executor = EndpointExecutor(
            self.store, endpoint, clock=self.clock, settings=self.executor_settings_for(endpoint_id)
        )
        await self._stack.enter_async_context(executor)
        self.executors[endpoint_id] = executor
        log.info("hub.executor_started endpoint=%s", endpoint_id)

    # -- Hub: auth and ingest -------------------------------------------------------------------------------
    async def authenticate(self, credentials: Credentials) -> AuthResult:
        result = await self.identities.authenticate(credentials)
        self._auth_methods[result.identity.id] = result.auth_method
        return result

    def _identity_stamps(self, identity: Identity) -> dict[str, str]:
        """The system properties the hub sets from the authenticated connection (its authority, not the head's)."""
        updates: dict[str, str] = {SystemProperty.CONNECTION_DEVICE_ID.value: identity.device_id}
        if identity.module_id is not None:
            updates[SystemProperty.CONNECTION_MODULE_ID.value] = identity.module_id
        method = self._auth_methods.get(identity.id)
        if method is not None:
            updates[SystemProperty.CONNECTION_AUTH_METHOD.value] = method
        return updates

    def _stamp(self, identity: Identity, messages: Sequence[Message]) -> list[Message]:
        """The messages as they will be stored: the connection's identity on each (a device cannot pass itself
        off as a module: that would change the message's route source), with the id and time stamps, in one
        copy per message. Every message the hub ingests is stamped here and nowhere else."""
        drop = _CONNECTION_MODULE_ID if identity.module_id is None else None
        return self._stamper.stamp_group(messages, self._identity_stamps(identity), drop=drop)

    async def _ingest_in_turn(self, identity: Identity, messages: Sequence[Message]) -> list[IngestOutcome]:
        """With duplicate detection: each message claims its id and is admitted to the store in turn (a claim
        or a wait for room holds the ones after it, so they keep their order), then all are awaited together."""
        arrived = self.store.clock.monotonic()
        stamped = self._stamp(identity, messages)
        refused = self._partition_refusals(identity, stamped)
        return await self._settle_admitted(
            [refused[i] if i in refused else await self._admit_one(identity, m, arrived) for i, m in enumerate(stamped)]
        )

    async def _admit_one(
        self, identity: Identity, message: Message, arrived_mono_s: float | None = None
    ) -> IngestOutcome | _Admitted:
        """Claim, route and admit one stamped message (``Store.admit``): its outcome if that is known already
        (refused, or a duplicate), else what is left to await."""
        claim = None
        if self._dedup is not None and message.message_id:
            claim = await self._dedup.claim(identity.id, message.message_id)
            if claim is None:
                log.debug("hub.duplicate_dropped identity=%s message_id=%s", identity, message.message_id)
                return Stored(None, duplicate=True)
        try:
            results = self.lanes.assign(message, self.router.route(message))
            receipt, durable = await self.store.admit(
                message,
                results,
                metadata=claim.metadata if claim else None,
                arrived_mono_s=arrived_mono_s,
                sender=identity.id,
            )
        except IngestRejected as exc:
            if claim is not None:
                claim.abandoned()
            return self._rejected(identity, exc)
        except BaseException:
            if claim is not None:
                claim.abandoned()  # not durable as far as we know: the device's retry must be taken
            raise
        if claim is not None:
            if durable is None:
                claim.accepted()
            else:
                # Settled when its write is, not when the caller gets to it: a copy of the same id later in the
                # group waits on this claim while it is admitted.
                durable.add_done_callback(functools.partial(_settle_claim, claim))
        return _Admitted(receipt, durable)

    async def _settle_admitted(self, admitted: list[IngestOutcome | _Admitted]) -> list[IngestOutcome]:
        """Wait until every admitted message is durable, wake the executors of their queues; the outcomes."""
        durable = [a.durable for a in admitted if isinstance(a, _Admitted) and a.durable is not None]
        if durable:
            await asyncio.gather(*durable)
        await self._notify({q.endpoint for a in admitted if isinstance(a, _Admitted) for q, _ in a.receipt.refs})
        return [Stored(a.receipt.message.edge_message_id) if isinstance(a, _Admitted) else a for a in admitted]

    async def _start_executor_once(self, endpoint_id: str) -> None:
        task = self._starting.get(endpoint_id)
        if task is None:
            task = asyncio.ensure_future(self._ensure_executor(endpoint_id))
            self._starting[endpoint_id] = task
        await asyncio.shield(task)

    async def ingest(self, identity: Identity, messages: Sequence[Message]) -> list[IngestOutcome]:
        if self._dedup is not None:  # each message claims its id in the duplicate window, one after the other
            return await self._ingest_in_turn(identity, messages)
        # One message too: a group of one is most groups of a publisher that waits for its acks (paho sends the
        # first message after an ack burst alone), and the group path awaits one write, not a gather of futures.
        return await self._ingest_group(identity, messages)

    async def _ingest_group(self, identity: Identity, messages: Sequence[Message]) -> list[IngestOutcome]:
        """A group (one read of a connection) routed here and stored in one write: a coroutine and a future
        per message cost more than routing it (bench.ingest's profile)."""
        outcomes: list[IngestOutcome | None] = [None] * len(messages)
        items: list[tuple[Message, Sequence[RouteResult]]] = []
        at: list[int] = []
        stamped = self._stamp(identity, messages)
        route, assign = self.router.route, self.lanes.assign
        refused = self._partition_refusals(identity, stamped)
        for i, message in enumerate(stamped):
            if refused and i in refused:
                outcomes[i] = refused[i]
                continue
            items.append((message, assign(message, route(message))))
            at.append(i)
        endpoints: set[str] = set()
        for i, result in zip(
            at, await self.store.enqueue_many(items, sender=identity.id) if items else [], strict=True
        ):
            if isinstance(result, IngestRejected):
                outcomes[i] = self._rejected(identity, result)
                continue
            for q, _ in result.refs:
                endpoints.add(q.endpoint)
            outcomes[i] = Stored(result.message.system_properties.get(_EDGE_MESSAGE_ID))
        await self._notify(endpoints)
        return [o for o in outcomes if o is not None]

    def _partition_refusals(self, identity: Identity, messages: Sequence[Message]) -> dict[int, Rejected]:
        """The refusals (by index) of the messages whose ``sessionId`` and ``partitionKey`` disagree."""
        refused: dict[int, Rejected] = {}
        for i, message in enumerate(messages):
            sp = message.system_properties
            if _SESSION_ID in sp and _PARTITION_KEY in sp:  # only when both are set can they disagree
                try:
                    check_partition_properties(message)
                except IngestRejected as exc:
                    refused[i] = self._rejected(identity, exc)
        return refused

    def _rejected(self, identity: Identity, exc: IngestRejected) -> Rejected:
        """The outcome of a refused message, logged through ``refusals`` (a flood of them logs a few lines)."""
        self.refusals.refused(exc.reason, peer=identity.id, client=identity.id, detail=exc)
        return Rejected(exc.reason, str(exc))

    async def _notify(self, endpoints: Iterable[str]) -> None:
        """Wake the executor of each endpoint (starting it the first time something is queued for it)."""
        for endpoint in endpoints:
            executor = self.executors.get(endpoint)
            if executor is None:
                await self._start_executor_once(endpoint)
                executor = self.executors.get(endpoint)
            if executor is not None:
                executor.notify()

    # -- partitions and duplicates -------------------------------------------------------------------------
    @property
    def duplicates_dropped(self) -> int:
        """Messages acknowledged and dropped as duplicates since start (0 with detection off)."""
        return self._dedup.duplicates if self._dedup is not None else 0

    def upstream_status(self) -> UpstreamLanesStatus:
        """The upstream's lanes, summed and one by one, with the duplicate counters."""
        return self.lanes.status(
            duplicates_dropped=self.duplicates_dropped,
            duplicate_ids_held=len(self._dedup) if self._dedup is not None else 0,
        )

    # -- Hub: links -----------------------------------------------------------------------------------------
    async def connect(self, identity: Identity, link: ClientLink, *, clean_session: bool) -> SessionInfo:
        self.methods.connect(identity, link)
        if identity.module_id is None:
            self.c2d.mailboxes.connect(identity, link)
            log.info("hub.device_connected identity=%s", identity)
            return SessionInfo(session_present=not clean_session and self.c2d.has_queued(identity.device_id))
        self.modules.connect(identity, link)
        log.info("hub.module_connected identity=%s", identity)
        # Queued module messages belong to the module, not to the MQTT session: they are kept across clean
        # sessions, so "session present" is only reported for a persistent session with something queued.
        return SessionInfo(session_present=not clean_session and self._has_queued(identity.module_id))

    def _has_queued(self, module_id: str) -> bool:
        for endpoint_id in self.executors:
            parsed = parse_module_endpoint(endpoint_id)
            if parsed is not None and parsed[0] == module_id:
                for q in self.store.queues(endpoint_id):
                    if self.store.end_offset(q) > self.store.checkpoint(q).committed + 1:
                        return True
        return False

    async def disconnect(self, identity: Identity, link: ClientLink) -> None:
        self.methods.disconnect(identity, link)
        if identity.module_id is not None:
            self.modules.disconnect(identity, link)
            log.info("hub.module_disconnected identity=%s", identity)
        else:
            self.c2d.mailboxes.disconnect(identity, link)
            log.info("hub.device_disconnected identity=%s", identity)

    def delivered(self, identity: Identity, delivery_id: int, ok: bool) -> None:
        if identity.module_id is not None:
            self.modules.delivered(identity, delivery_id, ok)
        else:
            self.c2d.mailboxes.delivered(identity, delivery_id, ok)

    def link_ready(self, identity: Identity, link: ClientLink) -> None:
        if identity.module_id is not None:
            self.modules.link_ready(identity, link)
        else:
            self.c2d.mailboxes.link_ready(identity, link)

    # -- cloud-to-device messages and direct methods (edgehub.core.methods.CloudCommands) -------------------
    def device_ids(self) -> list[str]:
        return self.identities.device_ids()

    async def cloud_to_device(self, device_id: str, message: Message) -> None:
        """Store ``message`` for ``device_id`` (``edgehub.hub.c2d``); raises ``IngestRejected`` (logged)."""
        [stamped] = self._stamper.stamp_group([message], {})
        try:
            endpoint = await self.c2d.accept(device_id, stamped)
        except IngestRejected as exc:
            self.refusals.refused(exc.reason, peer="$upstream", client=device_id[:128], detail=exc)
            raise
        await self._notify((endpoint,))

    def is_parent(self, parent: Identity, child: Identity) -> bool:
        return parent.module_id is None and self.identities.is_parent(parent, child)

    async def invoke_method(self, caller: str, target: Identity, call: MethodCall) -> MethodResult:
        """Relay a direct method call to ``target`` (``edgehub.hub.methods``); IoT Hub's answer, never raises."""
        return await self.methods.invoke(caller, target, call)

    def method_response(self, identity: Identity, rid: str, status: int, payload: bytes) -> bool:
        """A head got ``identity``'s answer to request ``rid``; False when no call waits for it (refused)."""
        return self.methods.respond(identity, rid, status, payload)

    # -- Hub: twins -----------------------------------------------------------------------------------------
    @property
    def twin_limits(self) -> TwinLimits:
        return self.twins.limits

    async def get_twin(self, identity: Identity) -> Mapping[str, Any]:
        twin = self.twins.get(identity)
        deployed = self._module_desired.get(identity.module_id) if identity.module_id is not None else None
        if deployed is None:
            return twin
        desired, version = deployed
        return {**twin, "desired": {**desired, "$version": version}}

    def set_module_desired(self, module_id: str, desired: Mapping[str, Any] | None, version: int) -> None:
        """The desired properties a deployment gives module ``module_id`` (None: none any more): what its twin GET
        answers from now on, and pushed at once to the module if connected, as the merge patch from what it had."""
        before = self._module_desired.get(module_id, ({}, 0))[0]
        after = dict(desired) if desired is not None else {}
        if desired is None:
            self._module_desired.pop(module_id, None)
        else:
            self._module_desired[module_id] = (after, version)
        patch = merge_diff(before, after)
        link = self.modules.link_of(module_id)
        if patch and isinstance(link, TwinLink):
            link.send_desired_patch(json.dumps({**patch, "$version": version}).encode(), version)
            log.info("hub.module_desired_pushed module=%s version=%d keys=%d", module_id, version, len(patch))

    async def update_reported(self, identity: Identity, patch: bytes | Mapping[str, Any]) -> int:
        try:
            checked: Mapping[str, Any]
            if isinstance(patch, bytes):
                checked = parse_reported_patch(patch, self.twins.limits)
            else:
                check_patch(patch, self.twins.limits)
                checked = patch
            async with self._twin_lock:
                version = await self.twins.update_reported(identity, checked)
        except TwinError as exc:
            self.refusals.refused(exc.refusal, peer=identity.id, client=identity.id, status=exc.status, detail=exc)
            raise
        await self._twin_changed(identity, checked, version)
        return version

    async def _twin_changed(self, identity: Identity, patch: Mapping[str, Any], version: int) -> None:
        """Route a twin change notification for a reported patch that was written (``FROM
        /twinChangeNotifications``), as IoT Hub makes them: the patch under ``properties.reported``. The patch is
        kept whatever becomes of its notification (a full queue refuses it: counted in the log, not an error)."""
        if not self.router.routes:
            return
        reported = {k: v for k, v in patch.items() if not k.startswith("$")}
        body = json.dumps({"version": version, "properties": {"reported": reported}}).encode()
        system = {
            _MESSAGE_TYPE: TWIN_CHANGE_NOTIFICATION,
            _CONTENT_TYPE: "application/json",
            _CONTENT_ENCODING: "utf-8",
        }
        properties = {"opType": "updateTwin", "deviceId": identity.device_id}
        if identity.module_id is not None:
            properties["moduleId"] = identity.module_id
        [outcome] = await self.ingest(identity, [Message(body, properties=properties, system_properties=system)])
        if isinstance(outcome, Rejected):
            log.info("hub.twin_notification_refused identity=%s reason=%s", identity, outcome.reason)


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A message the store has admitted: its receipt, and the future of its write (None: nothing to write)."""

    receipt: EnqueueReceipt
    durable: asyncio.Future[None] | None


def _settle_claim(claim: Claim, durable: asyncio.Future[None]) -> None:
    if durable.cancelled() or durable.exception() is not None:
        claim.abandoned()
    else:
        claim.accepted()
