"""What a checked deployment sets (``DesiredSettings``), as plain values in the runtime's names: made from the
manifest's models in the manifest check's process (``desired_settings``), sent to the serving hub as JSON, and
filled in there (``edgehub.runtime.deployment.settings.settings_of``). Imports neither the models (pydantic) nor
the store and the executors, so the check's process loads only what checking needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgehub.manifest import EdgeHubDesired

__all__ = ["QUEUE_KEYS", "RETRY_KEYS", "DesiredSettings", "EndpointWants", "desired_settings"]

RETRY_KEYS = {
    "retriesWithNoDelay": "retries_with_no_delay",
    "minimumDelayRetries": "minimum_delay_retries",
    "minimumDelaySecs": "minimum_delay_s",
    "maximumDelaySecs": "maximum_delay_s",
    "backoffRetries": "backoff_retries",
    "backoffFunction": "backoff_function",
    "maximumDelayRetries": "maximum_delay_retries",
    "jitter": "jitter",
    "ignoreEndpointOverride": "ignore_endpoint_override",
}
QUEUE_KEYS = {
    "maxMessageSizeBytes": "max_message_size_bytes",
    "maxQueueBytes": "max_bytes",
    "maxQueueMessages": "max_messages",
    "overflow": "overflow",
    "enqueueTimeoutSecs": "enqueue_timeout_s",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointWants:
    """What a deployment sets for one endpoint, in the runtime's names; what it leaves out is absent."""

    queue_policy: dict[str, Any] = field(default_factory=dict)  # QueuePolicy's fields
    retry_policy: dict[str, Any] | None = None  # RetryPolicy's fields; None: no override
    max_delivery_attempts: int | None = None
    drop: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DesiredSettings:
    """What a checked deployment sets, in the runtime's names, every key it leaves out absent (or None): plain
    values, so the manifest check sends them from its child process (``edgehub.runtime.deployment.check``) and the
    serving hub fills them in (``settings_of``) without the manifest's models."""

    default_ttl_s: float
    fsync: str | None = None
    fsync_interval_ms: int | None = None
    store_quota: dict[str, Any] = field(default_factory=dict)  # StoreQuota's fields
    queue_policy: dict[str, Any] = field(default_factory=dict)  # the hub's, QueuePolicy's fields
    retry_policy: dict[str, Any] | None = None  # the hub's, RetryPolicy's fields
    executor: dict[str, Any] = field(default_factory=dict)  # ExecutorSettings' fields
    endpoints: dict[str, EndpointWants] = field(default_factory=dict)
    module_window: int | None = None
    upstream: dict[str, Any] = field(default_factory=dict)  # the manifest's upstream section, every key
    # The keys of the above the document wrote itself (``upstream.partitions``, ...), where a schema default fills
    # the rest: ``edgehub config show`` names the manifest as the source of these only.
    given: tuple[str, ...] = ()


def desired_settings(desired: EdgeHubDesired) -> DesiredSettings:
    """What ``desired`` (validated) sets; see ``DesiredSettings``."""
    saf = desired.storeAndForwardConfiguration
    delivery = desired.delivery
    return DesiredSettings(
        default_ttl_s=float(desired.time_to_live_secs),
        fsync=saf.fsync,
        fsync_interval_ms=saf.fsyncIntervalMs,
        store_quota=_given(
            max_bytes=saf.maxStoreBytes,
            max_messages=saf.maxStoreMessages,
            identity_share=float(saf.identityShare) if saf.identityShare is not None else None,
        ),
        queue_policy=_renamed(QUEUE_KEYS, delivery.queuePolicy.model_dump()),
        retry_policy=_renamed(RETRY_KEYS, delivery.retryPolicy.model_dump()),
        executor=_given(
            max_delivery_attempts=delivery.maxDeliveryAttempts,
            cleanup_interval_s=float(saf.cleanupIntervalSecs) if saf.cleanupIntervalSecs else None,
            check_entire_queue_on_cleanup=(saf.cleanupMode == "entireQueue") if saf.cleanupMode else None,
        ),
        endpoints={
            endpoint: EndpointWants(
                queue_policy=_renamed(QUEUE_KEYS, conf.queuePolicy.model_dump()),
                retry_policy=_renamed(RETRY_KEYS, conf.retryPolicy.model_dump())
                if conf.retryPolicy is not None
                else None,
                max_delivery_attempts=conf.maxDeliveryAttempts,
                drop=conf.drop,
            )
            for endpoint, conf in desired.endpoints.items()
        },
        module_window=delivery.moduleDeliveryWindow,
        upstream=desired.upstream.model_dump(),
        given=(
            *(f"upstream.{key}" for key in sorted(desired.upstream.model_fields_set)),
            *(("storeAndForwardConfiguration.timeToLiveSecs",) if "timeToLiveSecs" in saf.model_fields_set else ()),
        ),
    )


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _renamed(names: dict[str, str], values: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``values`` that are set, under their runtime names."""
    return {names[k]: v for k, v in values.items() if v is not None}
