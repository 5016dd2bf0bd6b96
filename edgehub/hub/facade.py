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
* ``ingest`` is one path with optional stages (partition check, duplicate window, the store's admission): it
  routes and enqueues the messages of a group in their order, and the store's group commit writes them in one
  batch; a message that waits (for room, or for a copy of itself in flight to settle) holds the ones after it,
  and none overtakes another. It answers ``Stored`` only once a message is durable in every routed queue (a
  message no route takes is answered ``Stored`` too, as IoT Hub does: the device did nothing wrong),
  ``Rejected(reason)`` for an ``IngestRejected``, and raises only ``StoreError``;
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
  per identity), so a device flooding refused messages cannot flood the log;
* with a ``carriage`` (``edgehub.hub.Carriage``), a message every endpoint of its routes names can never carry
  (the rule its delivery would fail PERMANENT on, and be dead-lettered by) is refused at ingest
  (``Rejected("undeliverable")``) and nothing of it is stored; a message one endpoint can carry is stored for
  all of them, as before (the others dead-letter their copy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any, Self

from edgehub.core import (
    AuthenticationError,
    Clock,
    Identity,
    IngestRejected,
    Message,
    RouteResult,
    StoreError,
    SystemClock,
    SystemProperty,
    TwinError,
)
from edgehub.core.endpoints import parse_module_endpoint
from edgehub.core.logtext import shown
from edgehub.core.message import TWIN_CHANGE_NOTIFICATION
from edgehub.core.methods import MethodCall, MethodResult
from edgehub.core.opstats import OpStats
from edgehub.core.refusals import RateLimitedLog, RefusalLog, RefusalReason
from edgehub.core.sas import DEFAULT_MAX_TOKEN_LIFETIME_S
from edgehub.core.sealing import SecretSealer
from edgehub.delivery import Endpoint, EndpointExecutor, ExecutorSettings
from edgehub.hub import (
    AuthResult,
    Carriage,
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
from edgehub.store import Store

__all__ = ["EdgeHub"]

log = logging.getLogger(__name__)

_EDGE_MESSAGE_ID: str = SystemProperty.EDGE_MESSAGE_ID.value
_CONNECTION_MODULE_ID: str = SystemProperty.CONNECTION_MODULE_ID.value
_SESSION_ID: str = SystemProperty.SESSION_ID.value
_PARTITION_KEY: str = SystemProperty.PARTITION_KEY.value
_MESSAGE_TYPE: str = SystemProperty.MESSAGE_TYPE.value
_CONTENT_TYPE: str = SystemProperty.CONTENT_TYPE.value
_CONTENT_ENCODING: str = SystemProperty.CONTENT_ENCODING.value
_NO_CLAIMS: Mapping[int, Claim] = MappingProxyType({})  # the duplicate window's stage when it is off


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
        sealer: SecretSealer | None = None,
        carriage: Carriage | None = None,
    ) -> None:
        self.store = store
        self.router = router
        self.clock: Clock = clock or SystemClock()
        self._stamper = Stamper(store.clock)  # enqueuedTime on the store's clock, as its references' times
        self.identities = IdentityRegistry(
            store, host_name=host_name, clock=self.clock, max_token_lifetime_s=max_token_lifetime_s, sealer=sealer
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
        # Connects and disconnects are a client's doing: rate-limited per identity, as refusals are.
        self._events = RateLimitedLog(log, clock=self.clock)
        self.c2d = CloudToDevice(
            store, known=lambda i: self.identities.get(i) is not None, limits=c2d_limits, max_batch=module_batch
        )
        self.methods = MethodDispatcher(clock=self.clock, refusals=self.refusals, limits=method_limits)
        # Counted once per operation, for /metrics (edgehub.core.opstats): "edge" as Azure's source and target,
        # the hub itself answered (twins live in its store).
        self.twin_gets = OpStats("source", "id")
        self.reported_updates = OpStats("target", "id")
        self.client_connects = OpStats("id")
        self.client_disconnects = OpStats("id")
        # Logins the hub refused, by reason only: a claimed id is the client's word, not a label to keep.
        self.connect_failures = OpStats("reason")
        self.no_route = 0  # messages no route took: acknowledged, not stored
        self.unacked_store_failure = 0  # messages of groups the store failed to write: not acknowledged
        self.ingest_refused: dict[str, int] = {}  # messages ingest answered Rejected, by reason
        self._carriage = carriage  # None: every routed message is stored; see ``_never_carried``
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
        try:
            result = await self.identities.authenticate(credentials)
        except AuthenticationError:
            self.connect_failures.add(RefusalReason.BAD_CREDENTIALS.value)
            raise
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

    async def _start_executor_once(self, endpoint_id: str) -> None:
        task = self._starting.get(endpoint_id)
        if task is None:
            task = asyncio.ensure_future(self._ensure_executor(endpoint_id))
            self._starting[endpoint_id] = task
        await asyncio.shield(task)

    async def ingest(self, identity: Identity, messages: Sequence[Message]) -> list[IngestOutcome]:
        """The one ingest path, for a group (one read of a connection) as for one message, in stages: stamps,
        the partition check, the duplicate window (when on), then routing, the store's admission and one group
        write (``Store.admit_many``: a coroutine and a future per message would cost more than routing it).

        The duplicate window may cut the group in segments: a message whose id is still in flight (a copy
        earlier in the group, or in another write) is claimed once the segment before it is durable and that
        copy is settled. Only such a group carries its arrival time over to the store (its waits for room end
        ``enqueue_timeout_s`` after it)."""
        arrived = self.store.clock.monotonic() if self._dedup is not None else None
        stamped = self._stamp(identity, messages)
        outcomes: list[IngestOutcome | None] = [None] * len(stamped)
        self._check_partitions(identity, stamped, outcomes)
        endpoints: set[str] = set()
        start, n = 0, len(stamped)
        while start < n:
            end, claims, twin = (
                (n, _NO_CLAIMS, None) if self._dedup is None else self._claim_ids(identity, stamped, outcomes, start)
            )
            await self._store_segment(identity, stamped, outcomes, range(start, end), claims, arrived, endpoints)
            if twin is not None:
                await asyncio.shield(twin)  # settled: the message at ``end`` is claimed in the next turn
            start = end
        await self._notify(endpoints)
        return outcomes  # type: ignore[return-value]  # each message got its outcome in one of the stages

    def _check_partitions(
        self, identity: Identity, messages: Sequence[Message], outcomes: list[IngestOutcome | None]
    ) -> None:
        """The partition stage: refuse the messages whose ``sessionId`` and ``partitionKey`` disagree."""
        for i, message in enumerate(messages):
            sp = message.system_properties
            if _SESSION_ID in sp and _PARTITION_KEY in sp:  # only when both are set can they disagree
                try:
                    check_partition_properties(message)
                except IngestRejected as exc:
                    outcomes[i] = self._rejected(identity, exc)

    def _claim_ids(
        self, identity: Identity, messages: Sequence[Message], outcomes: list[IngestOutcome | None], start: int
    ) -> tuple[int, dict[int, Claim], asyncio.Future[bool] | None]:
        """The duplicate window's stage, from ``start`` on: each message with a ``messageId`` claims it (a
        duplicate is answered here), up to the first whose id is still in flight. That message's index (the end
        of the segment to store now), the claims by index, and the settlement of the copy in flight."""
        claims: dict[int, Claim] = {}
        dedup = self._dedup
        assert dedup is not None
        for i in range(start, len(messages)):
            message_id = messages[i].message_id
            if outcomes[i] is not None or not message_id:
                continue
            twin = dedup.in_flight(identity.id, message_id)
            if twin is not None:
                return i, claims, twin
            claim = dedup.claim(identity.id, message_id)
            if claim is None:
                log.debug("hub.duplicate_dropped identity=%s message_id=%s", identity, message_id)
                outcomes[i] = Stored(None, duplicate=True)
            else:
                claims[i] = claim
        return len(messages), claims, None

    async def _store_segment(
        self,
        identity: Identity,
        messages: Sequence[Message],
        outcomes: list[IngestOutcome | None],
        segment: range,
        claims: Mapping[int, Claim],
        arrived_mono_s: float | None,
        endpoints: set[str],
    ) -> None:
        """Route the segment's messages that have no outcome yet, admit and write them (one call to the store),
        wait until they are durable and set their outcomes; note the endpoints they went to. A claim is
        accepted once its message is durable, abandoned if it was refused or its write failed (or was not
        waited for: the device's retry must then be taken)."""
        router, assign = self.router, self.lanes.assigner()
        route, unrouted = router.route, router.unrouted
        carriage = self._carriage
        todo: list[int] = []
        items: list[tuple[Message, Sequence[RouteResult]]] = []
        for i in segment:
            if outcomes[i] is None:
                m = messages[i]
                chosen = route(m)
                if carriage is not None and chosen and (why := _never_carried(carriage, m, chosen)) is not None:
                    claim = claims.get(i)
                    if claim is not None:
                        claim.abandoned()
                    outcomes[i] = self._rejected(identity, IngestRejected(why, reason=RefusalReason.UNDELIVERABLE))
                    continue
                todo.append(i)
                items.append((m, chosen if assign is None else assign(m, chosen)))
        # Per group, from the router's count: kept here so that a new deployment's router does not reset it.
        self.no_route += router.unrouted - unrouted
        if not todo:
            return
        metadata = [claims[i].metadata if i in claims else None for i in todo] if claims else None
        try:
            results, durable = await self.store.admit_many(
                items, sender=identity.id, metadata=metadata, arrived_mono_s=arrived_mono_s
            )
            if len(durable) == 1:
                await durable[0]
            elif durable:
                await asyncio.gather(*durable)
        except BaseException as exc:
            for unsettled in claims.values():
                unsettled.abandoned()
            if isinstance(exc, StoreError):  # ingest raises: the head acknowledges none of the group
                self.unacked_store_failure += len(messages)
            raise
        for i, result in zip(todo, results, strict=True):
            claim = claims.get(i)
            if isinstance(result, IngestRejected):
                if claim is not None:
                    claim.abandoned()
                outcomes[i] = self._rejected(identity, result)
                continue
            if claim is not None:
                claim.accepted()
            for q, _ in result.refs:
                endpoints.add(q.endpoint)
            outcomes[i] = Stored(result.message.system_properties.get(_EDGE_MESSAGE_ID))

    def _rejected(self, identity: Identity, exc: IngestRejected) -> Rejected:
        """The outcome of a refused message, logged through ``refusals`` (a flood of them logs a few lines) and
        counted by reason (``ingest_refused``)."""
        self.ingest_refused[exc.reason] = self.ingest_refused.get(exc.reason, 0) + 1
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

    def given_endpoint(self, endpoint_id: str) -> Endpoint | None:
        """The endpoint the hub was started with under ``endpoint_id`` (an upstream lane's transport), or None."""
        return self._given.get(endpoint_id)

    def upstream_status(self) -> UpstreamLanesStatus:
        """The upstream's lanes, summed and one by one, with the duplicate counters."""
        return self.lanes.status(
            duplicates_dropped=self.duplicates_dropped,
            duplicate_ids_held=len(self._dedup) if self._dedup is not None else 0,
        )

    # -- Hub: links -----------------------------------------------------------------------------------------
    async def connect(self, identity: Identity, link: ClientLink, *, clean_session: bool) -> SessionInfo:
        self.client_connects.add(identity.id)
        self.methods.connect(identity, link)
        if identity.module_id is None:
            self.c2d.mailboxes.connect(identity, link)
            self._events.line(identity.id, "hub.device_connected", identity=identity)
            return SessionInfo(session_present=not clean_session and self.c2d.has_queued(identity.device_id))
        self.modules.connect(identity, link)
        self._events.line(identity.id, "hub.module_connected", identity=identity)
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
        self.client_disconnects.add(identity.id)  # a link taken over by a newer login too: it was disconnected
        self.methods.disconnect(identity, link)
        if identity.module_id is not None:
            self.modules.disconnect(identity, link)
            self._events.line(identity.id, "hub.module_disconnected", identity=identity)
        else:
            self.c2d.mailboxes.disconnect(identity, link)
            self._events.line(identity.id, "hub.device_disconnected", identity=identity)

    def delivered(self, identity: Identity, delivery_id: int, ok: bool) -> None:
        self.delivered_many(identity, ((delivery_id, ok),))

    def delivered_many(self, identity: Identity, outcomes: Iterable[tuple[int, bool]]) -> None:
        mailboxes = self.modules if identity.module_id is not None else self.c2d.mailboxes
        mailboxes.delivered(identity, outcomes)

    def dead_letter(self, identity: Identity, delivery_id: int, reason: str) -> None:
        mailboxes = self.modules if identity.module_id is not None else self.c2d.mailboxes
        mailboxes.dead_letter(identity, delivery_id, reason)

    def set_delivery_window(self, window: int) -> None:
        """Deliveries in flight at once to each connected module, and to each device (its cloud-to-device
        messages), from now on (``edgehub.hub.modules``); ``ValueError`` outside 1-65535."""
        self.modules.window = window
        self.c2d.mailboxes.window = window

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
            self.refusals.refused(exc.reason, peer="$upstream", client=shown(device_id), detail=exc)
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
        started = self.clock.monotonic()
        twin = self.twins.get(identity)
        deployed = self._module_desired.get(identity.module_id) if identity.module_id is not None else None
        if deployed is not None:
            desired, version = deployed
            twin = {**twin, "desired": {**desired, "$version": version}}
        self.twin_gets.add("edge", identity.id, seconds=self.clock.monotonic() - started)
        return twin

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
        started = self.clock.monotonic()
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
        finally:  # every call, refused ones too (Azure counts calls); the time is the patch's write
            self.reported_updates.add("edge", identity.id, seconds=self.clock.monotonic() - started)
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
            self._events.line(identity.id, "hub.twin_notification_refused", identity=identity, reason=outcome.reason)


def _never_carried(carriage: Carriage, message: Message, chosen: Sequence[RouteResult]) -> str | None:
    """Why none of the endpoints ``chosen`` names could ever carry ``message`` (the reasons, joined), or None when
    one could."""
    reasons: list[str] = []
    for result in chosen:
        why = carriage.cannot_carry(result.endpoint, message)
        if why is None:
            return None
        reasons.append(why)
    return "; ".join(dict.fromkeys(reasons))
