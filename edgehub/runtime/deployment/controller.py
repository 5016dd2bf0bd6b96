"""Desired properties applied live, reported back: the ``DeploymentController``.

Three ways in, applied the same way (``put_desired``, ``patch_desired``): the manifest file given to ``edgehub run
--manifest`` (``watch``: its modification time and size polled about once a second, applied when its content
changed), the local admin API, and twin patches from the cloud over the upstream. Each is checked whole
(in a child process, ``edgehub.runtime.deployment.plan.check_deployment``: every problem with its location, and
the serving hub never loads the manifest's models nor the route parser) before anything changes.

Invariants:
* an update is atomic: the router, the store's TTL, queue policies, quota and fsync policy, the module delivery
  window and every executor's settings are switched between two awaits, so no message is routed under one update
  and admitted under another; connections are not touched; messages already stored keep the priority and TTL
  they were stored with;
* an update that gives the upstream new links is refused when a secret one names is not there (the environment
  variable unset, the file unreadable): applied, it would stop the next start;
* a refused update changes nothing that runs: it is answered 400 with every error, logged through the
  ``RefusalLog`` (``deployment_invalid``), and reported (``lastDesiredVersion``, ``lastDesiredStatus``);
* an endpoint no longer named by any route keeps its executor and drains what it holds, unless the update says
  ``endpoints.<id>.drop``: then what it holds is removed (``RemovalReason.DROPPED``) and counted in
  ``droppedOnUpdate``;
* updates are applied one at a time, in the order they came (a lock); ``$version`` is the desired document's, or
  one more than the last when it carries none;
* the running desired properties, the module twins and the reported properties are kept in the store
  (``deployment/state``), with the digest of the manifest file as last read. The rule of precedence at start
  (``start_point``): the file wins when it changed since (the user edited it: it is applied as it is); else the
  deployment that last applied wins, whichever way it came (file, admin API, cloud), so a patch outlives the
  restart, and what only a start can apply (the upstream's lanes and link) takes it then. The running
  deployment's checked plan is kept too: a start that runs it again does not check it again.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import edgehub
from edgehub.core import Clock, StoreError, SystemClock, TwinError
from edgehub.core.endpoints import parse_module_endpoint
from edgehub.core.refusals import RefusalLog, RefusalReason
from edgehub.delivery.retry import effective_policy
from edgehub.hub.facade import EdgeHub
from edgehub.hub.twins import TwinLimits, check_patch
from edgehub.manifest.documents import MAX_MANIFEST_BYTES, ManifestError, edgehub_section, read_manifest_file
from edgehub.runtime.compose.links import missing_secrets
from edgehub.runtime.deployment.plan import (
    DeploymentCheckFailed,
    DeploymentPlan,
    Runnable,
    check_deployment,
    plan_from_value,
    runnable,
)
from edgehub.runtime.deployment.settings import RunningSettings, StartSettings
from edgehub.runtime.deployment.state import (
    MAX_REPORTED_QUEUES,
    STATE_KEY,
    LiveGrants,
    decode_state,
    encode_state,
    merge_patch,
    queue_figures,
)
from edgehub.store import RemovalReason, Store

__all__ = ["PLAN_FORMAT", "DeploymentController", "DesiredStatus", "StartPoint", "start_point", "start_point_of"]

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
# A kept plan is run again only by the edgehub that made it (its checks and its plan's shape may change).
PLAN_FORMAT = f"{edgehub.__version__}/1"
REPORTED_SCHEMA = "1.0"


@dataclass(frozen=True)
class DesiredStatus:
    code: int  # 200, or 400 with every error and its location
    description: str
    errors: tuple[str, ...]
    version: int | None  # the $version applied (or refused)


class DeploymentController:
    """Applies desired properties to a running ``EdgeHub``; see the module docstring."""

    def __init__(
        self,
        hub: EdgeHub,
        start: StartSettings,
        *,
        clock: Clock | None = None,
        check: Callable[[Any], Awaitable[DeploymentPlan]] = check_deployment,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``check``: a document to its plan or ``ManifestError`` (by default in a child process); ``env``: where
        the links' secrets named by environment variable are looked for (by default ``os.environ``, as at start)."""
        self._hub = hub
        self._env = os.environ if env is None else env
        self._check = check
        self._start = start
        self._clock: Clock = clock or SystemClock()
        self._lock = asyncio.Lock()
        self._refusals = RefusalLog(log, clock=self._clock)
        self.publish_grants = LiveGrants("publish")
        self.subscribe_grants = LiveGrants("subscribe")
        self._desired: dict[str, Any] = {}  # the $edgeHub desired properties that run
        self._module_twins: dict[str, Mapping[str, Any]] = {}
        self._deployment: Runnable | None = None
        self._plan: DeploymentPlan | None = None  # of what runs, its $edgeHub section alone (kept in the store)
        self._settings: RunningSettings | None = None
        self._version: int | None = None  # of what runs
        self._last_version: int | None = None  # of the last update, applied or refused
        self._status = DesiredStatus(200, "no desired properties yet", (), None)
        self._source = ""
        self._dropped: dict[str, int] = {}
        self._file_digest: str | None = None
        self._listeners: list[Callable[[dict[str, object]], None]] = []

    # -- the interface the admin API, the watcher and the upstream use --------------------------------------
    def reported(self) -> dict[str, object]:
        """The reported properties document."""
        settings = self._settings
        out: dict[str, object] = {
            "schemaVersion": REPORTED_SCHEMA,
            "lastDesiredVersion": self._last_version,
            "lastDesiredStatus": {
                "code": self._status.code,
                "description": self._status.description,
                "errors": list(self._status.errors),
            },
            "runningDesiredVersion": self._version,
            "source": self._source,
            "unsupported": list(self._deployment.unsupported) if self._deployment else [],
            "restartRequired": list(settings.restart_required) if settings else [],
            "droppedOnUpdate": [{"endpoint": e, "messages": n} for e, n in sorted(self._dropped.items())],
            "queues": queue_figures(self._hub.store, self._hub.store.clock.time()),
        }
        if settings is not None and self._deployment is not None:
            out["running"] = _running_figures(settings, self._deployment, self._hub)
        return out

    @property
    def running_version(self) -> int | None:
        """The ``$version`` of the desired properties that run (None before any): the upstream's twin channel puts
        a fetched desired document only when its version is another."""
        return self._version

    def desired(self) -> dict[str, object]:
        """The ``$edgeHub`` desired properties that run (with their ``$version``)."""
        return copy.deepcopy(self._desired)

    async def put_desired(self, desired: dict[str, object], *, source: str) -> DesiredStatus:
        """Apply ``desired`` (a deployment manifest, or the ``$edgeHub`` desired properties alone) whole."""
        async with self._lock:
            return await self._put(desired, source=source)

    async def patch_desired(self, patch: dict[str, object], *, source: str) -> DesiredStatus:
        """Apply ``patch`` (RFC 7386 JSON merge patch) over the ``$edgeHub`` desired properties that run."""
        async with self._lock:
            if not isinstance(patch, dict):
                return await self._refuse(["(top): a merge patch of desired properties is a JSON object"], None, source)
            base = {k: v for k, v in self._desired.items() if k != "$version"}
            merged = merge_patch(base, patch)
            return await self._put(merged, source=source)

    def on_reported(self, listener: Callable[[dict[str, object]], None]) -> None:
        """Call ``listener`` with the reported properties after every update (applied or refused)."""
        self._listeners.append(listener)

    def module_desired(self, module_id: str) -> Mapping[str, Any] | None:
        """``modulesContent.<module>.properties.desired`` of the running deployment (None: not in it)."""
        return self._module_twins.get(module_id)

    @property
    def deployment(self) -> Runnable | None:
        return self._deployment

    # -- start and the manifest file -------------------------------------------------------------------------
    async def start(self, manifest: Path, *, checked: tuple[Any, DeploymentPlan] | None = None) -> DesiredStatus:
        """Apply the manifest file at start, or what the store kept when the file has not changed since (so a
        cloud patch applied over it outlives a restart). ``ManifestError`` when neither can run (the hub does
        not start on a manifest it refuses). ``checked``: the file's document and plan, when the start checked
        it already (so the same document is not checked twice)."""
        document, plan = checked if checked is not None else (read_manifest_file(manifest), None)
        digest = _digest(manifest)
        kept = decode_state(self._hub.store.get_metadata(STATE_KEY))
        self._file_digest = digest  # kept with the state from the first put on, so the next start compares it
        if kept is not None and kept.get("fileDigest") == digest and isinstance(kept.get("desired"), dict):
            self._restore(kept)
            # What the store kept is most often the file's own desired properties (no cloud patch since): their
            # plan is the file's, without its modules.
            same = plan is not None and _unversioned(kept["desired"]) == _unversioned(_section(document))
            async with self._lock:
                status = await self._put(
                    kept["desired"],
                    source=str(kept.get("source") or "store"),
                    plan=plan.section_only() if same and plan is not None else None,
                )
            if status.code == 200 and status.version is not None:
                for module_id, desired in self._module_twins.items():  # kept, not in the document put
                    self._hub.set_module_desired(module_id, desired, status.version)
                return status
            self._module_twins = {}
            document, plan = read_manifest_file(manifest), None  # what was kept no longer runs: the file does
        async with self._lock:
            status = await self._put(document, source="file", plan=plan)
        if status.code != 200:
            raise ManifestError(f"{manifest}: {status.description}", status.errors)
        return status

    async def watch(self, manifest: Path, *, interval_s: float = WATCH_INTERVAL_S) -> None:
        """Poll ``manifest`` (modification time and size) every ``interval_s``; apply it when its content changed.
        Runs until cancelled; a file that cannot be read or applied is reported, never raised."""
        last: tuple[int, int] | bool | None = False  # the first poll compares content: a change before it counts
        while True:
            await asyncio.sleep(interval_s)
            now = _stat(manifest)
            if now == last:
                continue
            last = now
            try:
                await self.apply_file(manifest)
            except StoreError as exc:  # the store failing must not end the watch (nor, through it, the hub)
                log.warning("deployment.watch_failed path=%s error=%s", manifest, exc)

    async def apply_file(self, manifest: Path) -> DesiredStatus | None:
        """Apply ``manifest`` if its content differs from what was last applied from it (None: unchanged)."""
        try:
            digest = _digest(manifest)
            if digest == self._file_digest:
                return None
            document = read_manifest_file(manifest)
        except ManifestError as exc:
            async with self._lock:
                return await self._refuse(list(exc.errors), None, "file")
        except OSError as exc:
            async with self._lock:
                return await self._refuse([f"(top): cannot read {manifest}: {exc.strerror}"], None, "file")
        status = await self.put_desired(document, source="file")
        self._file_digest = digest
        await self._persist()
        return status

    # -- applying ----------------------------------------------------------------------------------------------
    async def _put(self, document: Any, *, source: str, plan: DeploymentPlan | None = None) -> DesiredStatus:
        version = _version_of(document)
        try:
            if plan is None:
                plan = await self._check(document)
            deployment = runnable(plan, self._start)
        except ManifestError as exc:
            reason = (
                RefusalReason.DEPLOYMENT_CHECK_FAILED
                if isinstance(exc, DeploymentCheckFailed)
                else RefusalReason.DEPLOYMENT_INVALID
            )
            return await self._refuse(list(exc.errors), version, source, reason=reason)
        settings = deployment.settings
        twin_errors = _module_twin_problems(deployment, self._hub.twin_limits)
        if twin_errors:
            return await self._refuse(twin_errors, version, source)
        if "upstream.links" in settings.restart_required:  # new links: the next start must find their secrets
            links = deployment.plan.settings.upstream.get("links") or []
            secret_errors = await asyncio.to_thread(missing_secrets, links, self._env)
            if secret_errors:
                return await self._refuse(secret_errors, version, source)
        if version is None:
            version = (self._last_version or 0) + 1
        section, in_manifest = edgehub_section(document)
        dropped = await self._apply(deployment, settings)
        self._desired = {**copy.deepcopy(section), "$version": version}
        changed = self._set_module_twins(deployment, in_manifest)
        self._deployment, self._settings = deployment, settings
        self._plan = plan.section_only()
        self._version = self._last_version = version
        self._source = source
        self._status = DesiredStatus(200, "applied", (), version)
        log.info(
            "deployment.applied version=%s source=%s routes=%d endpoints=%d dropped=%s unsupported=%d",
            version,
            source,
            len(deployment.router.routes),
            len(deployment.plan.settings.endpoints),
            dropped or "-",
            len(deployment.unsupported),
        )
        for module_id in changed:
            self._hub.set_module_desired(module_id, self._module_twins.get(module_id), version)
        await self._persist()
        self._notify()
        return self._status

    async def _apply(self, deployment: Runnable, settings: RunningSettings) -> dict[str, int]:
        """Switch everything at once (no await in between), then drop what the update says to drop."""
        hub, store = self._hub, self._hub.store
        hub.router = deployment.router
        store.default_ttl_s = settings.default_ttl_s
        store.default_policy = settings.default_policy
        policies = store.endpoint_policies
        policies.clear()
        policies.update(settings.endpoint_policies)
        store.store_quota = settings.store_quota
        store.set_fsync(settings.fsync, settings.fsync_interval_ms)
        hub.executor_settings_for = settings.executor_settings
        hub.set_delivery_window(settings.module_window)
        for endpoint_id, executor in hub.executors.items():
            executor.reconfigure(settings.executor_settings(endpoint_id))
        self.publish_grants.update(deployment.grants)
        self.subscribe_grants.update(deployment.grants)
        named = {r.result.endpoint for r in deployment.router.routes}
        dropped: dict[str, int] = {}
        for endpoint_id, conf in deployment.plan.settings.endpoints.items():
            if conf.drop and endpoint_id not in named:
                n = await self._drop(endpoint_id)
                if n:
                    dropped[endpoint_id] = n
                    self._dropped[endpoint_id] = self._dropped.get(endpoint_id, 0) + n
        return dropped

    async def _drop(self, endpoint_id: str) -> int:
        store = self._hub.store
        removed = 0
        try:
            for q in store.queues(endpoint_id):
                start = store.checkpoint(q).committed + 1
                while True:
                    refs = store.references(q, start, 4096)
                    if not refs:
                        break
                    removed += await store.remove(q, [r.offset for r in refs], RemovalReason.DROPPED)
                    start = refs[-1].offset + 1
        except StoreError as exc:  # what is left drains; the update itself stands
            log.warning("deployment.drop_failed endpoint=%s removed=%d error=%s", endpoint_id, removed, exc)
        if removed:
            log.info("deployment.endpoint_dropped endpoint=%s messages=%d", endpoint_id, removed)
        return removed

    def _set_module_twins(self, deployment: Runnable, in_manifest: bool) -> list[str]:
        """Take the module twins of a whole manifest (the desired properties alone leave them); the modules whose
        desired properties changed."""
        if not in_manifest:
            return []
        before = self._module_twins
        after: dict[str, Mapping[str, Any]] = dict(deployment.plan.module_twins)
        self._module_twins = after
        return sorted(m for m in before.keys() | after.keys() if before.get(m) != after.get(m))

    async def _refuse(
        self,
        errors: list[str],
        version: int | None,
        source: str,
        *,
        reason: RefusalReason = RefusalReason.DEPLOYMENT_INVALID,
    ) -> DesiredStatus:
        self._last_version = version if version is not None else self._last_version
        description = "refused: " + "; ".join(errors)
        self._status = DesiredStatus(400, description, tuple(errors), version)
        self._refusals.refused(reason, peer=source, client=source, version=version, errors=len(errors))
        log.info("deployment.refused version=%s source=%s errors=%s", version, source, "; ".join(errors[:5]))
        await self._persist()
        self._notify()
        return self._status

    def _notify(self) -> None:
        if not self._listeners:
            return
        reported = self.reported()
        for listener in self._listeners:
            listener(reported)

    # -- kept in the store ---------------------------------------------------------------------------------------
    async def _persist(self) -> None:
        state = {
            "desired": self._desired,
            "moduleTwins": self._module_twins,
            "source": self._source,
            "lastDesiredVersion": self._last_version,
            "lastDesiredStatus": {
                "code": self._status.code,
                "description": self._status.description,
                "errors": list(self._status.errors),
            },
            "droppedOnUpdate": self._dropped,
            "fileDigest": self._file_digest,
            "plan": asdict(self._plan) if self._plan is not None else None,
            "planFormat": PLAN_FORMAT,
        }
        try:
            await self._hub.store.put_metadata(STATE_KEY, encode_state(state))
        except StoreError as exc:  # what runs is not undone for it: kept again at the next update
            log.warning("deployment.state_not_kept error=%s", exc)

    def _restore(self, kept: Mapping[str, Any]) -> None:
        twins = kept.get("moduleTwins")
        if isinstance(twins, dict):
            self._module_twins = {k: v for k, v in twins.items() if isinstance(v, dict)}
        dropped = kept.get("droppedOnUpdate")
        if isinstance(dropped, dict):
            self._dropped = {k: v for k, v in dropped.items() if isinstance(v, int)}
        last = kept.get("lastDesiredVersion")
        self._last_version = last if isinstance(last, int) else None


@dataclass(frozen=True)
class StartPoint:
    """What a start runs (``start_point``): ``document``, the manifest file's or the desired properties the store
    kept; ``plan``, its checked plan when the store kept one this edgehub made (None: check ``document``);
    ``source``, where it came from (``file``, or the kept deployment's: ``admin``, ``cloud``, ``file``); ``reason``,
    why, for the start's log line."""

    document: Any
    plan: DeploymentPlan | None
    source: str
    reason: str


def start_point(store: Store, manifest: Path, document: Any) -> StartPoint:
    """The rule of precedence at start (module docstring): the manifest file (``document``, read from ``manifest``)
    when nothing is kept or the file changed since it was last read; else the deployment that last applied, as the
    store kept it."""
    return start_point_of(store.get_metadata(STATE_KEY), manifest, document)


def start_point_of(kept_state: bytes | None, manifest: Path, document: Any) -> StartPoint:
    """``start_point`` from the kept state's bytes (``STATE_KEY``'s value; None: nothing kept), for a reader of a
    store it does not open as the hub does (``edgehub config show``)."""
    kept = decode_state(kept_state)
    if kept is None or not isinstance(kept.get("desired"), dict):
        return StartPoint(document, None, "file", "nothing kept yet")
    if kept.get("fileDigest") != _digest(manifest):
        return StartPoint(document, None, "file", "the manifest file changed since the last start: the file wins")
    plan = plan_from_value(kept.get("plan")) if kept.get("planFormat") == PLAN_FORMAT else None
    desired: dict[str, Any] = kept["desired"]
    if _unversioned(desired) == _unversioned(_section(document)):
        return StartPoint(document, plan, "file", "kept: the manifest file, unchanged and last applied")
    source = str(kept.get("source") or "store")
    version = desired.get("$version")
    why = f"kept: version {version} from {source}, applied after the manifest file, which is unchanged since"
    return StartPoint(desired, plan, source, why)


def _module_twin_problems(deployment: Runnable, limits: TwinLimits) -> list[str]:
    """The module twins' desired properties against IoT Hub's twin limits (as reported properties are held)."""
    out = []
    for module_id, desired in deployment.plan.module_twins.items():
        where = f"modulesContent.{module_id}.properties.desired"
        try:
            check_patch(desired, limits)
        except TwinError as exc:
            out.append(f"{where}: {exc}")
            continue
        size = len(json.dumps(desired, separators=(",", ":")).encode())
        if size > limits.max_reported_bytes:
            out.append(f"{where}: {size} bytes, over the twin limit of {limits.max_reported_bytes}")
    return out


def _running_figures(settings: RunningSettings, deployment: Runnable, hub: EdgeHub) -> dict[str, object]:
    """The settings in force: the routes, the hub's and every endpoint's effective ones (endpoints in a list:
    their ids are no twin keys)."""
    endpoints = sorted(set(hub.executors) | set(settings.endpoint_executors) | set(settings.endpoint_policies))
    endpoints = endpoints[:MAX_REPORTED_QUEUES]  # IoT Hub keeps 32 KB of reported properties
    texts = {r.name: r.text for r in deployment.plan.routes}  # route names are twin keys: no '.', '$', '#' or space
    routes = {
        r.name: {"route": texts[r.name], "priority": r.priority, "timeToLiveSecs": r.ttl_s}
        for r in deployment.router.routes
    }
    return {
        "routes": routes,
        "timeToLiveSecs": settings.default_ttl_s,
        "fsync": str(settings.fsync),
        "fsyncIntervalMs": settings.fsync_interval_ms,
        "storeQuota": {
            "maxBytes": settings.store_quota.max_bytes,
            "maxMessages": settings.store_quota.max_messages,
            "identityShare": settings.store_quota.identity_share,
        },
        "moduleDeliveryWindow": settings.module_window,
        "endpoints": [_endpoint_figures(settings, e) for e in endpoints],
    }


def _endpoint_figures(settings: RunningSettings, endpoint_id: str) -> dict[str, object]:
    ex = settings.executor_settings(endpoint_id)
    policy = settings.queue_policy(endpoint_id)
    retry = effective_policy(ex.retry_policy, ex.endpoint_retry_policy)
    return {
        "endpoint": endpoint_id,
        "kind": "module" if parse_module_endpoint(endpoint_id) else "upstream",
        "queuePolicy": {
            "maxMessageSizeBytes": policy.max_message_size_bytes,
            "maxQueueBytes": policy.max_bytes,
            "maxQueueMessages": policy.max_messages,
            "overflow": str(policy.overflow),
            "enqueueTimeoutSecs": policy.enqueue_timeout_s,
        },
        "retryPolicy": {
            "minimumDelaySecs": retry.minimum_delay_s,
            "maximumDelaySecs": retry.maximum_delay_s,
            "backoffFunction": str(retry.backoff_function),
            "backoffRetries": retry.backoff_retries,
        },
        "maxDeliveryAttempts": ex.max_delivery_attempts,
        "cleanupIntervalSecs": ex.cleanup_interval_s,
        "cleanupMode": "entireQueue" if ex.check_entire_queue_on_cleanup else "headOnly",
    }


def _version_of(document: Any) -> int | None:
    try:
        section, _ = edgehub_section(document)
    except ManifestError:
        return None
    version = section.get("$version") if isinstance(section, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) and version >= 0 else None


def _section(document: Any) -> Any:
    try:
        return edgehub_section(document)[0]
    except ManifestError:
        return None


def _unversioned(section: Any) -> Any:
    return {k: v for k, v in section.items() if k != "$version"} if isinstance(section, dict) else section


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _digest(path: Path) -> str:
    # Bounded as read_manifest_file is: one read of at most MAX_MANIFEST_BYTES + 1.
    with path.open("rb") as f:
        return hashlib.sha256(f.read(MAX_MANIFEST_BYTES + 1)).hexdigest()
