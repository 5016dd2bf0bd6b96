"""From a checked deployment to the values the store and the executors run with (``RunningSettings``).

The manifest's models leave every unset key None. ``desired_settings`` (in the manifest check's process) takes
what a deployment sets as plain values (``DesiredSettings``); ``settings_of`` (in the serving hub) fills each
unset key from the one home of its default (``QueuePolicy``, ``RetryPolicy``, ``ExecutorSettings``, the
start-time ``StartSettings`` the command line gave), and the values' own checks run (``minimumDelaySecs`` above
``maximumDelaySecs`` is refused by ``RetryPolicy``). Every such refusal is collected with its location, so a
deployment is refused with all of its problems at once.

Invariants:
* every executor has its own effective settings (``executor_settings(endpoint)``): the hub's retry policy, or the
  endpoint's override unless the hub's says ``ignoreEndpointOverride``; ``maxDeliveryAttempts`` the endpoint's,
  else the hub's; cleanup the store's;
* a queue policy key the endpoint leaves out is the hub's (``delivery.queuePolicy``), and one the hub leaves out
  is ``QueuePolicy``'s default;
* the module delivery window is the deployment's ``delivery.moduleDeliveryWindow``, else the command line's
  (``StartSettings.module_window``), else ``DEFAULT_WINDOW``; it applies live;
* what only a restart can change (the upstream's lanes and link) is compared with what the hub started with and
  named in ``restart_required``, never applied halfway (a restart then runs it: the deployment that last applied
  is what the next start uses, ``edgehub.runtime.deployment.controller.start_point``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from edgehub.delivery import ExecutorSettings
from edgehub.delivery.retry import BackoffFunction, RetryPolicy
from edgehub.hub.modules import DEFAULT_WINDOW
from edgehub.manifest.documents import ManifestError
from edgehub.runtime.deployment.wants import QUEUE_KEYS, RETRY_KEYS, DesiredSettings, desired_settings
from edgehub.store import FsyncPolicy, Overflow, QueuePolicy, StoreQuota

if TYPE_CHECKING:  # the models are the manifest check's (a child process), not the serving hub's
    from edgehub.manifest import EdgeHubDesired

__all__ = ["RunningSettings", "StartSettings", "running_settings", "settings_of"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class StartSettings:
    """What the command line started the hub with: the base every deployment fills its unset keys from."""

    executor: ExecutorSettings = field(default_factory=ExecutorSettings)
    store_quota: StoreQuota = field(default_factory=StoreQuota)
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 10
    module_window: int | None = None
    upstream: dict[str, Any] = field(default_factory=dict)  # the manifest's upstream section at start


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningSettings:
    default_ttl_s: float
    default_policy: QueuePolicy
    endpoint_policies: dict[str, QueuePolicy]
    store_quota: StoreQuota
    fsync: FsyncPolicy
    fsync_interval_ms: int
    hub_executor: ExecutorSettings
    endpoint_executors: dict[str, ExecutorSettings]
    module_window: int = DEFAULT_WINDOW
    restart_required: tuple[str, ...] = ()

    def executor_settings(self, endpoint_id: str) -> ExecutorSettings:
        return self.endpoint_executors.get(endpoint_id, self.hub_executor)

    def queue_policy(self, endpoint_id: str) -> QueuePolicy:
        return self.endpoint_policies.get(endpoint_id, self.default_policy)


def running_settings(desired: EdgeHubDesired, start: StartSettings) -> RunningSettings:
    """See the module docstring; ``ManifestError`` listing every problem with its location."""
    return settings_of(desired_settings(desired), start)


def settings_of(wanted: DesiredSettings, start: StartSettings) -> RunningSettings:
    """``wanted`` filled in from ``start`` and the defaults; ``ManifestError`` listing every problem with its
    location."""
    problems: list[str] = []

    def build(where: str, make: Callable[[], T]) -> T | None:
        try:
            return make()
        except (ValueError, TypeError) as exc:  # TypeError: a key the values do not have (a bad answer)
            problems.append(f"{where}: {_manifest_names(str(exc))}")
            return None

    fsync = build("storeAndForwardConfiguration.fsync", lambda: FsyncPolicy(wanted.fsync or start.fsync))
    if wanted.fsync_interval_ms is not None and fsync is not FsyncPolicy.INTERVAL:
        problems.append("storeAndForwardConfiguration.fsyncIntervalMs: only with fsync 'interval'")
    quota = build("storeAndForwardConfiguration", lambda: replace(start.store_quota, **wanted.store_quota))
    default_policy = build("delivery.queuePolicy", lambda: _queue_policy(QueuePolicy(), wanted.queue_policy))
    hub_retry = build("delivery.retryPolicy", lambda: _retry_policy(start.executor.retry_policy, wanted.retry_policy))
    hub_executor = None
    if hub_retry is not None:
        hub_executor = build(
            "storeAndForwardConfiguration",
            lambda: replace(start.executor, retry_policy=hub_retry, endpoint_retry_policy=None, **wanted.executor),
        )
    policies: dict[str, QueuePolicy] = {}
    executors: dict[str, ExecutorSettings] = {}
    for endpoint, conf in wanted.endpoints.items():
        where = f"endpoints.{endpoint}"
        if default_policy is not None:
            p = build(f"{where}.queuePolicy", partial(_queue_policy, default_policy, conf.queue_policy))
            if p is not None:
                policies[endpoint] = p
        override = None
        if conf.retry_policy is not None:
            override = build(f"{where}.retryPolicy", partial(_retry_policy, RetryPolicy(), conf.retry_policy))
        if hub_executor is not None:
            attempts = conf.max_delivery_attempts or hub_executor.max_delivery_attempts
            executors[endpoint] = replace(hub_executor, endpoint_retry_policy=override, max_delivery_attempts=attempts)
    if problems or fsync is None or quota is None or default_policy is None or hub_executor is None:
        raise ManifestError(f"deployment refused: {'; '.join(problems)}", tuple(problems))
    return RunningSettings(
        default_ttl_s=wanted.default_ttl_s,
        default_policy=default_policy,
        endpoint_policies=policies,
        store_quota=quota,
        fsync=fsync,
        fsync_interval_ms=wanted.fsync_interval_ms or start.fsync_interval_ms,
        hub_executor=hub_executor,
        endpoint_executors=executors,
        module_window=wanted.module_window or start.module_window or DEFAULT_WINDOW,
        restart_required=tuple(_restart_required(wanted, start)),
    )


def _manifest_names(text: str) -> str:
    """A value's error in the manifest's words (``minimum_delay_s`` is ``minimumDelaySecs`` there)."""
    for key, name in (*RETRY_KEYS.items(), *QUEUE_KEYS.items()):
        text = re.sub(rf"\b{name}\b", key, text)
    return text


def _queue_policy(base: QueuePolicy, wanted: dict[str, Any]) -> QueuePolicy:
    changes = dict(wanted)
    if "overflow" in changes:
        changes["overflow"] = Overflow(changes["overflow"])
    if "enqueue_timeout_s" in changes:
        changes["enqueue_timeout_s"] = float(changes["enqueue_timeout_s"])
    return replace(base, **changes)


def _retry_policy(base: RetryPolicy, wanted: dict[str, Any] | None) -> RetryPolicy:
    if not wanted:
        return base
    changes = dict(wanted)
    if "backoff_function" in changes:
        changes["backoff_function"] = BackoffFunction(changes["backoff_function"])
    for name in ("minimum_delay_s", "maximum_delay_s", "jitter"):
        if name in changes:
            changes[name] = float(changes[name])
    return replace(base, **changes)


def _restart_required(wanted: DesiredSettings, start: StartSettings) -> list[str]:
    return [f"upstream.{k}" for k, v in wanted.upstream.items() if start.upstream and start.upstream.get(k) != v]
